package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/errcode"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
)

// startCoordinator runs this member's orphan coordinator
// (requests.Coordinator) until d.stop: it asks live members over the API
// to adopt departed owners' requests, and adopts its previous run's here.
func (d *Daemon) startCoordinator(interval, idle time.Duration) {
	c := &requests.Coordinator{
		Self:    d.cfg.MemberID,
		Members: d.members,
		Owners:  d.reqStore.Owners,
		Adopt: func(ctx context.Context, a requests.Adoption) error {
			cli := &api.Client{NC: d.Bus.Conn, Member: a.Target}
			msg := &messages.AdoptRequestMsg{RequestId: a.Request, DeadOwner: a.DeadOwner}
			if !a.DepartedAt.IsZero() {
				msg.DepartedUnixMs = a.DepartedAt.UnixMilli()
			}
			_, err := cli.Adopt(ctx, msg)
			return asFenced(err)
		},
		AdoptHere: func(ctx context.Context, req, owner string) error {
			_, err := d.requestAPI.Adopt(ctx, &messages.AdoptRequestMsg{RequestId: req, DeadOwner: owner})
			return asFenced(err)
		},
		Running: func(req string) bool {
			_, ok := d.reqTable.Lookup(req)
			return ok
		},
		Interval:     interval,
		IdleInterval: idle,
		Log:          d.log,
	}
	d.wg.Add(2)
	go func() {
		defer d.wg.Done()
		c.Run(d.stop)
	}()
	go func() {
		defer d.wg.Done()
		d.purgeRequestMarkers()
	}()
}

// markerSweepTimeout bounds the one sweep of old delete markers at start.
const markerSweepTimeout = 5 * time.Minute

// purgeRequestMarkers removes, once, the delete markers finished requests
// left in the request bucket before finishes purged them (an upgrade, or a
// failed purge), so that the orphan scans stop reading them now rather
// than after request_ttl_s, and the stray prompts of finishes cut short
// (requests.KVStore.PurgeMarkers). It gives up when connexd stops.
func (d *Daemon) purgeRequestMarkers() {
	ctx, cancel := context.WithTimeout(context.Background(), markerSweepTimeout)
	defer cancel()
	go func() {
		select {
		case <-d.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	n, err := d.reqStore.PurgeMarkers(ctx)
	select {
	case <-d.stop:
		return
	default:
	}
	switch {
	case err != nil:
		d.log.Warn("purging old delete markers and stray prompts from the request bucket failed; they expire after request_ttl_s", "purged", n, "err", err)
	case n > 0:
		d.log.Info("purged old delete markers and stray prompts from the request bucket", "purged", n)
	}
}

// asFenced makes an error with the API code fenced (someone adopted the
// request already) one the coordinator recognises: requests.ErrFenced.
func asFenced(err error) error {
	if err != nil && !errors.Is(err, requests.ErrFenced) && errcode.Of(err) == api.CodeFenced {
		return fmt.Errorf("%w: %w", requests.ErrFenced, err)
	}
	return err
}
