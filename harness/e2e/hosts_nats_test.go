package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// pullLoad keeps one decode engine pulling the same hold, pull after pull,
// through a client connection of its own; every pull is checked (ok, bytes
// verified). A pull.start that finds no responder (the member is between
// NATS servers) or gets no answer (lost with a server) is sent again with
// the same pull id, as the engine shim does: connexd treats it as the same
// pull.
type pullLoad struct {
	name     string
	ok       atomic.Int64 // read by the test while the load runs
	failures []string
	slowest  time.Duration
	stop     chan struct{}
	done     chan struct{}
}

func (c *hostPD) startPullLoad(t *testing.T, on string, nc *nats.Conn, prm *messages.KVTransferParams, src, dst []uint32) *pullLoad {
	e := c.engines[on]
	cli := &api.Client{NC: nc, Member: on}
	notes := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(api.PullDoneSubject(e.cli.Member, e.id), notes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	l := &pullLoad{name: on, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for i := 0; ; i++ {
			select {
			case <-l.stop:
				return
			default:
			}
			id := fmt.Sprintf("load-%s-%d", on, i)
			t0 := time.Now()
			var err error
			for {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err = cli.StartPull(ctx, &messages.StartPullRequest{Params: prm, EngineId: e.id, RegionId: e.rid, BlockIds: dst, PullId: id})
				cancel()
				if !(errors.Is(err, nats.ErrNoResponders) || api.CodeOf(err) == api.CodeTimeout) || time.Since(t0) > 20*time.Second {
					break
				}
			}
			if err != nil {
				l.failures = append(l.failures, fmt.Sprintf("%s: start: %v", id, err))
				continue
			}
			d := awaitPullDone(notes, cli, e.id, id, 20*time.Second)
			switch {
			case d == nil:
				l.failures = append(l.failures, id+": no pull.done within 20s")
			case !d.Ok:
				l.failures = append(l.failures, fmt.Sprintf("%s: %v", id, d))
			case blocksDiffer(c.engP.region, e.region, src, dst) != nil:
				l.failures = append(l.failures, fmt.Sprintf("%s: %v", id, blocksDiffer(c.engP.region, e.region, src, dst)))
			default:
				l.ok.Add(1)
				l.slowest = max(l.slowest, time.Since(t0))
			}
		}
	}()
	return l
}

// awaitPullDone reads notices off ch until the one of pull id, or nil
// after total. Like the engine shim, it asks connexd's notice journal
// (engine.notices) when the live notice is late: a notice published as the
// member's NATS server died is lost on the wire (core NATS is at most once)
// and kept in the journal.
func awaitPullDone(ch <-chan *nats.Msg, cli *api.Client, engine, id string, total time.Duration) *messages.PullDone {
	timeout := time.NewTimer(total)
	defer timeout.Stop()
	replay := time.NewTicker(time.Second)
	defer replay.Stop()
	for {
		select {
		case m := <-ch:
			d := new(messages.PullDone)
			if proto.Unmarshal(m.Data, d) == nil && d.PullId == id {
				return d
			}
		case <-replay.C:
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			rep, err := cli.EngineNotices(ctx, &messages.NoticesRequest{EngineId: engine})
			cancel()
			if err != nil {
				continue
			}
			for _, n := range rep.Notices {
				if d := n.GetPullDone(); d != nil && d.PullId == id {
					return d
				}
			}
		case <-timeout.C:
			return nil
		}
	}
}

// end stops the load and reports what it saw.
func (l *pullLoad) end(t *testing.T) {
	t.Helper()
	close(l.stop)
	<-l.done
	t.Logf("load on %s: %d pulls ok, slowest %s, %d failed", l.name, l.ok.Load(), l.slowest.Round(time.Millisecond), len(l.failures))
	for _, f := range l.failures {
		t.Errorf("load on %s: %s", l.name, f)
	}
}

// TestHostsNATSServerKilledUnderLoad SIGKILLs the NATS server that leads
// the request bucket while two decode hosts pull from the prefill host
// without pause and two requests are in flight: every pull completes with
// the hold's bytes, the hold is still held, a new leader takes the bucket,
// the requests keep their tokens and take new ones, and the killed server,
// started again, catches up.
func TestHostsNATSServerKilledUnderLoad(t *testing.T) {
	c := newHostPD(t, 3)
	// One hold per request: connexd binds a hold to its request's engine,
	// and a bound hold serves only that engine.
	srcs := map[string][]uint32{"d2": {1, 2, 3, 4, 5, 6, 7, 8}, "d3": {11, 12, 13, 14, 15, 16, 17, 18}}
	prms := map[string]*messages.KVTransferParams{"d2": c.hold(t, srcs["d2"], 128), "d3": c.hold(t, srcs["d3"], 128)}
	p := prompt(128)
	for d, toks := range map[string][]uint32{"d2": {7, 8}, "d3": {9}} {
		e := c.engines[d]
		if _, err := e.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-" + d, Params: prms[d], PromptTokenIds: p, EngineId: e.id}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.cli.Progress(ctx5(t), &messages.RequestProgress{RequestId: "r-" + d, Epoch: 1, TokenIds: toks}); err != nil {
			t.Fatal(err)
		}
	}
	info, err := bucketInfo(ctx5(t), c.ncs["p1"])
	if err != nil {
		t.Fatal(err)
	}
	victim := c.server(info.Cluster.Leader)
	// The load's own connections are to a server that stays.
	var stable *clusterNATS
	for _, ns := range c.nats {
		if ns != victim {
			stable = ns
			break
		}
	}
	ncStable := c.conn(stable.host)
	loads := []*pullLoad{
		c.startPullLoad(t, "d2", ncStable, prms["d2"], srcs["d2"], []uint32{10, 11, 12, 13, 14, 15, 16, 17}),
		c.startPullLoad(t, "d3", ncStable, prms["d3"], srcs["d3"], []uint32{20, 21, 22, 23, 24, 25, 26, 27}),
	}
	// Some pulls before the kill, and a while of them after it.
	checkFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if loads[0].ok.Load() < 5 || loads[1].ok.Load() < 5 {
			return fmt.Errorf("pulls ok before the kill: %d, %d", loads[0].ok.Load(), loads[1].ok.Load())
		}
		return nil
	})
	// Each member is on its host's server (nats_url in order, its own
	// first): one of them loses its server with the leader.
	names, err := victim.clients()
	if err != nil {
		t.Fatal(err)
	}
	var onVictim []string
	for _, n := range names {
		if _, member := c.procs[n]; member {
			onVictim = append(onVictim, n)
		}
	}
	if len(onVictim) == 0 {
		t.Fatalf("no connexd on %s (%s): clients %q", victim.name, victim.host.Name, names)
	}
	before := loads[0].ok.Load() + loads[1].ok.Load()
	killed := time.Now()
	victim.kill()
	t.Logf("killed %s (the request bucket's leader, on %s, serving %q)", victim.name, victim.host.Name, onVictim)
	cli := &api.Client{NC: ncStable, Member: "d2"}
	var newLeader string
	checkFor(t, 30*time.Second, 50*time.Millisecond, func() error {
		info, err := bucketInfo(ctx5(t), ncStable)
		if err != nil {
			return err
		}
		if info.Cluster == nil || info.Cluster.Leader == "" || info.Cluster.Leader == victim.name {
			return fmt.Errorf("bucket leader %+v", info.Cluster)
		}
		newLeader = info.Cluster.Leader
		return nil
	})
	t.Logf("kill -> new bucket leader %s: %s", newLeader, time.Since(killed).Round(time.Millisecond))
	checkFor(t, 30*time.Second, 20*time.Millisecond, func() error {
		if n := loads[0].ok.Load() + loads[1].ok.Load(); n < before+20 {
			return fmt.Errorf("%d pulls ok since the kill", n-before)
		}
		return nil
	})
	for _, l := range loads {
		l.end(t)
	}
	// The requests kept their state, and the first write after the kill is
	// accepted.
	for d, toks := range map[string][]uint32{"d2": {7, 8}, "d3": {9}} {
		var st *messages.RequestStatus
		checkFor(t, 20*time.Second, 50*time.Millisecond, func() error {
			st, err = cli.InspectRequest(ctx5(t), &messages.RequestRef{RequestId: "r-" + d})
			return err
		})
		if st.State.Owner != d || st.State.Epoch != 1 || !slices.Equal(st.State.GeneratedTokenIds, toks) {
			t.Fatalf("r-%s after the kill: %v", d, st.State)
		}
		wrote := time.Now()
		if _, err := c.engines[d].cli.Progress(ctx5(t), &messages.RequestProgress{RequestId: "r-" + d, Epoch: 1, TokenIds: []uint32{99}}); err != nil {
			t.Fatalf("progress of r-%s after the kill: %v", d, err)
		}
		t.Logf("r-%s: progress after the kill took %s", d, time.Since(wrote).Round(time.Millisecond))
	}
	for d, prm := range prms {
		hs, err := c.engP.cli.Inspect(ctx5(t), &messages.HoldRef{TransferId: prm.TransferId})
		if err != nil || hs.State != "held" {
			t.Fatalf("r-%s's hold after the kill: %v %v", d, hs, err)
		}
	}
	// The killed server comes back and its replica catches up.
	victim.start()
	checkFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		info, err := bucketInfo(ctx5(t), ncStable)
		if err != nil {
			return err
		}
		for _, r := range info.Cluster.Replicas {
			if r.Name == victim.name && r.Current {
				return nil
			}
		}
		return fmt.Errorf("%s not a current replica: %+v", victim.name, info.Cluster)
	})
	t.Logf("%s restarted and current again", victim.name)
}
