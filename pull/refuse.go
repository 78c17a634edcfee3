package pull

// Refuse ends p without reading: it gives back the destination blocks and
// the region reference, then publishes p's PullDone with err (a pull whose
// request's start failed, or never came: StartPullRequest.await_start).
func Refuse(deps *PullDeps, p *Pull, err error) {
	p.Dst.Blocks.EndWrite(p.DstBlocks)
	p.ReleaseRegion()
	pl := &puller{deps: deps, p: p, start: deps.clock().Now()}
	pl.finish(0, err)
}
