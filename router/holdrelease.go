package router

import (
	"context"
	"time"
)

// releaseTimeout bounds the router's hold.release of an ended request.
const releaseTimeout = 2 * time.Second

// Why a request ended without an answer (connex_router_hold_releases_total).
const (
	endRejected   = "rejected"
	endFailed     = "failed"
	endClientGone = "client_gone"
)

// endReason names why a request with error e ended: the client left
// (clientGone), a decode engine refused it (a 4xx), or none could run it.
func endReason(clientGone bool, e *APIError) string {
	switch {
	case clientGone:
		return endClientGone
	case e.Status >= 400 && e.Status < 500:
		return endRejected
	}
	return endFailed
}

// releaseHold hands back the prefill hold of request rid, which ended
// without an answer for reason. Otherwise a hold no decode engine took up
// would stay until its claim deadline or retain_s. A hold a decode engine
// bound refuses the release: that engine's request actor frees it when it
// ends (and a resumed request's new engine still needs it).
func (s *Server) releaseHold(pre *prefilled, rid, reason string) {
	if s.cfg.ReleaseHold == nil || pre == nil || len(pre.params) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	if err := s.cfg.ReleaseHold(ctx, pre.params, rid); err != nil {
		s.metrics.holdReleases.WithLabelValues(reason, "refused").Inc()
		s.log.Debug("hold of an ended request not released by the router", "request_id", rid, "reason", reason, "err", err)
		return
	}
	s.metrics.holdReleases.WithLabelValues(reason, "ok").Inc()
	s.log.Info("released the hold of a request that ended without a decode engine", "request_id", rid, "reason", reason)
}
