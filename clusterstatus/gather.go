// Package clusterstatus gathers a cluster's state over NATS — every member's
// engines, holds, requests and pulls (member.status) — and renders it for
// an operator: `connexd status`. Gathering does I/O; rendering is pure.
package clusterstatus

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

// Report is the cluster as the members answered, at At.
type Report struct {
	At      time.Time
	Members []*messages.MemberStatus
	// Unanswered lists members that answered discovery but not
	// member.status (overloaded, shutting down, an older version).
	Unanswered map[string]string
}

// Gather discovers the members serving the connex API ($SRV.PING.connex
// answers, collected until quiet for settle or until ctx ends) and asks
// each for member.status.
func Gather(ctx context.Context, nc *nats.Conn, settle time.Duration) (*Report, error) {
	names, err := discover(ctx, nc, settle)
	if err != nil {
		return nil, err
	}
	r := &Report{At: time.Now(), Unanswered: map[string]string{}}
	for _, name := range names {
		st, err := (&api.Client{NC: nc, Member: name}).MemberStatus(ctx, &messages.MemberStatusRequest{})
		if err != nil {
			r.Unanswered[name] = err.Error()
			continue
		}
		r.Members = append(r.Members, st)
	}
	return r, nil
}

// discover lists the member ids of every connex micro service on nc.
func discover(ctx context.Context, nc *nats.Conn, settle time.Duration) ([]string, error) {
	inbox := nc.NewRespInbox()
	ch := make(chan *nats.Msg, 256)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, fmt.Errorf("status: subscribe: %w", err)
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SRV.PING."+api.ServiceName, inbox, nil); err != nil {
		return nil, fmt.Errorf("status: ping: %w", err)
	}
	var names []string
	quiet := time.NewTimer(settle)
	defer quiet.Stop()
	for {
		select {
		case m := <-ch:
			var ping struct {
				Metadata map[string]string `json:"metadata"`
			}
			if json.Unmarshal(m.Data, &ping) == nil && ping.Metadata["member"] != "" {
				names = append(names, ping.Metadata["member"])
			}
			quiet.Reset(settle)
		case <-quiet.C:
			slices.Sort(names)
			return slices.Compact(names), nil
		case <-ctx.Done():
			if len(names) > 0 {
				slices.Sort(names)
				return slices.Compact(names), nil
			}
			return nil, fmt.Errorf("status: no connex member answered: %w", ctx.Err())
		}
	}
}
