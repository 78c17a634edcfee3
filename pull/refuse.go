package pull

// Refuse ends p without reading (a pull whose request's start failed, or
// never came: StartPullRequest.await_start), on the daemon's background
// group (PullDeps.Go): it gives back the destination blocks and the region
// reference, then publishes p's PullDone with err. It counts as a pull
// started and failed.
func Refuse(deps *PullDeps, p *Pull, err error) {
	deps.Metrics.PullsStarted.Add(1)
	deps.goBackground(func() {
		p.Dst.Blocks.EndWrite(p.DstBlocks)
		p.ReleaseRegion()
		pl := &puller{deps: deps, p: p, start: deps.clock().Now()}
		pl.finish(0, err)
	})
}
