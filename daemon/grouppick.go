package daemon

import (
	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
)

// groupPick is the positions of the hold's block list a pull with
// group_skip_blocks reads, in order: each KV cache group's share of the
// hold (params.group_blocks, group after group) less its first skips[g]
// blocks. nil when the pull names no group skips. The pull moves whole
// blocks, so the hold's block size must be the region's.
func groupPick(p *messages.KVTransferParams, r *messages.StartPullRequest, dst kvmem.Layout) ([]int, error) {
	skips := r.GroupSkipBlocks
	if len(skips) == 0 {
		return nil, nil
	}
	counts := p.GroupBlocks
	switch {
	case r.SkipBlocks != 0:
		return nil, api.Errorf(api.CodeBadRequest, "skip_blocks=%d and group_skip_blocks: give one or the other", r.SkipBlocks)
	case len(skips) != len(counts):
		return nil, api.Errorf(api.CodeBadBlockIDs, "group_skip_blocks names %d groups, params.group_blocks %d", len(skips), len(counts))
	case p.BlockSize != 0 && p.BlockSize != dst.BlockSize:
		return nil, api.Errorf(api.CodeIncompatible, "group_skip_blocks: blocks move whole, and the holder's block_size %d is not this region's %d", p.BlockSize, dst.BlockSize)
	}
	total := 0
	for _, c := range counts {
		total += int(c)
	}
	if total != len(p.RemoteBlockIds) {
		return nil, api.Errorf(api.CodeBadBlockIDs, "params.group_blocks add up to %d blocks, the hold has %d", total, len(p.RemoteBlockIds))
	}
	var pick []int
	start := 0
	for g, c := range counts {
		if skips[g] > c {
			return nil, api.Errorf(api.CodeBadBlockIDs, "group_skip_blocks[%d]=%d: the group has %d blocks in the hold", g, skips[g], c)
		}
		for i := start + int(skips[g]); i < start+int(c); i++ {
			pick = append(pick, i)
		}
		start += int(c)
	}
	if len(pick) == 0 {
		return nil, api.Errorf(api.CodeBadBlockIDs, "group_skip_blocks skip every block of the hold: the pull must read at least one")
	}
	return pick, nil
}
