package kvmem

// RegroupShape is tp's regroup plan in numbers, for tests: its groups
// (destination blocks and planes), the pairs among its copy runs, and the
// groups that are dense and pairwise.
func RegroupShape(tp *TilePlan) (groups, pairs, dense, pairwise int) {
	for _, g := range tp.regroup {
		for _, pr := range g.pairs {
			if pr.b >= 0 {
				pairs++
			}
		}
		if g.dense {
			dense++
		}
		if g.pairwise {
			pairwise++
		}
	}
	return len(tp.regroup), pairs, dense, pairwise
}
