package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/cluster"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
	"github.com/connex/connex/router"
	"google.golang.org/protobuf/encoding/protojson"
)

// startRouter serves the OpenAI-compatible front door on http_listen (role
// router). Engines come from membership: every member advertises the engines
// registered with it.
func (d *Daemon) startRouter() error {
	if d.cluster == nil {
		return fmt.Errorf("role router needs cluster membership, which needs JetStream: %v", d.reqErr)
	}
	srv, err := router.New(router.Config{
		Listen:  d.cfg.HTTPListen,
		Engines: d.advertisedEngines,
		Stall: router.StallRule{Factor: float64(d.cfg.RouterStallFactor), Floor: d.cfg.RouterStallFloor, Ceiling: d.cfg.RouterStallCeiling,
			Cold: d.cfg.RouterStall, FirstToken: d.cfg.RouterFirstToken},
		Clock:             d.clock,
		PrefillTimeout:    d.cfg.RouterPrefillTimeout,
		MaxResumes:        d.cfg.RouterMaxResumes,
		NoAssignSeed:      d.cfg.RouterAssignSeed == "off",
		MaxBodyBytes:      int64(d.cfg.RouterMaxBodyBytes),
		ReadHeaderTimeout: d.cfg.RouterReadHeaderTimeout,
		ReadTimeout:       d.cfg.RouterReadTimeout,
		IdleTimeout:       d.cfg.RouterIdleTimeout,
		MaxConns:          d.cfg.RouterMaxConns,
		MaxInFlight:       d.cfg.RouterMaxInFlight,
		APIKeys:           d.cfg.APIKeys,
		AdminKeys:         d.cfg.AdminKeys,
		Authorize:         d.grantTakeover,
		ReleaseHold:       d.releaseEndedHold,
		Busy:              d.routeBusy(),
		Log:               d.log.With("component", "router"),
	})
	if err != nil {
		return err
	}
	d.Router = srv
	return nil
}

// grantTakeover gives the router's word to e's member that e may take
// request requestID over (peer.grant).
func (d *Daemon) grantTakeover(ctx context.Context, e router.Engine, requestID string) error {
	c, cancel := context.WithTimeout(ctx, askTimeout)
	defer cancel()
	_, err := (&api.Client{NC: d.Bus.Conn, Member: e.Member}).GrantTakeover(c, &messages.StartRequestMsg{RequestId: requestID, EngineId: e.Info.GetEngineId(), Takeover: true,
		// The grant stands as long as the router waits for the leg's first
		// token: the engine's takeover may wait in its queue that long.
		GrantTtlMs: uint32(min(d.cfg.RouterFirstToken, requests.MaxGrantTTL) / time.Millisecond)})
	if err != nil {
		return fmt.Errorf("peer.grant of request %s to engine %s on %s: %w", requestID, e.Info.GetEngineId(), e.Member, err)
	}
	return nil
}

// releaseEndedHold releases, for the router, the hold params name: its
// request ended without an answer. The holder allows it only while no
// decode engine bound the hold (a bound hold is its request's to free).
func (d *Daemon) releaseEndedHold(ctx context.Context, params json.RawMessage, requestID string) error {
	var kv messages.KVTransferParams
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(params, &kv); err != nil {
		return fmt.Errorf("kv_transfer_params of request %s: %w", requestID, err)
	}
	member := kv.GetRemoteCtrl().GetMember()
	if member == "" || kv.GetTransferId() == "" {
		return fmt.Errorf("kv_transfer_params of request %s name no hold (remote_ctrl.member, transfer_id)", requestID)
	}
	_, err := (&api.Client{NC: d.Bus.Conn, Member: member}).Release(ctx, &messages.HoldRef{TransferId: kv.GetTransferId(), Requester: d.cfg.MemberID})
	if err != nil {
		return fmt.Errorf("hold.release for request %s on %s: %w", requestID, member, err)
	}
	return nil
}

// advertisedEngines is every engine live members advertise. The router
// asks several times per request and once per running leg every 100 ms;
// the list changes only with the view (heartbeats), so it is built once
// per view generation and shared: the router reads it and never writes.
func (d *Daemon) advertisedEngines() []router.Engine {
	prov, gen := d.cluster.generation()
	d.engView.mu.Lock()
	defer d.engView.mu.Unlock()
	if prov != nil && prov == d.engView.prov && gen == d.engView.gen {
		return d.engView.list
	}
	var out []router.Engine
	for _, m := range d.cluster.Members() {
		if m.Name == "" {
			continue
		}
		for _, e := range m.Engines {
			out = append(out, router.Engine{Member: m.Name, Info: e, Suspect: m.Suspect})
		}
	}
	// gen was read before Members: a change in between rebuilds next time.
	d.engView.prov, d.engView.gen, d.engView.list = prov, gen, out
	return out
}

// engineView is the router's engine list of one view generation
// (advertisedEngines).
type engineView struct {
	mu   sync.Mutex
	prov *cluster.Provider
	gen  uint64
	list []router.Engine
}

func (d *Daemon) stopRouter() {
	if d.Router == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := d.Router.Close(ctx); err != nil {
		d.log.Warn("router did not stop cleanly", "err", err)
	}
}

// routeBusy is router.Config.Busy: a completion the router serves is
// work in hand until it ends.
func (d *Daemon) routeBusy() func() func() {
	done := func() {
		d.routing.Add(-1)
		d.activity.Touch()
	}
	return func() func() {
		d.routing.Add(1)
		d.activity.Touch()
		return done
	}
}
