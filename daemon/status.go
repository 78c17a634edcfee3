package daemon

import (
	"context"
	"fmt"
	"slices"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

// MemberStatus is everything this member keeps (member.status): its
// engines, holds, requests and pulls, for `connexd status`.
func (d *Daemon) MemberStatus(ctx context.Context, _ *messages.MemberStatusRequest) (*messages.MemberStatus, error) {
	st := &messages.MemberStatus{
		MemberId: d.cfg.MemberID, Role: d.cfg.Role, Backend: d.Backend.Name(), DataAddr: PrintableAddr(d.Backend.Address()),
		StartedUnixMs: d.started.UnixMilli(), Version: Version, Pulls: d.inflight.of(""),
	}
	d.engMu.Lock()
	live, _ := d.engines.reg.Live(d.now())
	for _, e := range live {
		st.Engines = append(st.Engines, proto.CloneOf(e))
	}
	d.engMu.Unlock()
	for _, e := range d.dir.All() {
		if rep, err := d.ask(e.PID, &actors.InspectHold{}); err == nil && rep.Status != nil {
			st.Holds = append(st.Holds, rep.Status)
		}
	}
	slices.SortFunc(st.Holds, func(a, b *messages.HoldStatus) int { return int(a.CreatedUnixMs - b.CreatedUnixMs) })
	for _, pid := range d.reqTable.All() {
		if rep, err := d.askRequestActor(pid, &actors.InspectRequest{}); err == nil && rep.GetState() != nil {
			st.Requests = append(st.Requests, rep.GetState())
		}
	}
	if d.cluster != nil {
		for _, m := range d.cluster.Members() {
			if m.Name != "" {
				st.ClusterMembers = append(st.ClusterMembers, m.Name)
			}
		}
		slices.Sort(st.ClusterMembers)
		st.ClusterMembers = slices.Compact(st.ClusterMembers)
	}
	return st, ctx.Err()
}

// PrintableAddr shows a data-plane address as text when it is (TCP
// host:port) and as its size and a short hex prefix when it is binary (a
// UCX worker address), so that it fits one line (the ready line, status).
func PrintableAddr(addr []byte) string {
	for _, c := range addr {
		if c < 0x21 || c > 0x7e {
			n := min(len(addr), 8)
			return fmt.Sprintf("binary:%dB:%x…", len(addr), addr[:n])
		}
	}
	return string(addr)
}
