package e2e

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/daemon"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/netlab"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// pullOn has member on's engine pull params into dst and waits for the
// pull's notice (total bounds the wait).
func (c *hostPD) pullOn(t *testing.T, on, id string, prm *messages.KVTransferParams, dst []uint32, total time.Duration) *messages.PullDone {
	t.Helper()
	e := c.engines[on]
	done := subscribe(t, c.ncs[on], api.PullDoneSubject(e.id), func() *messages.PullDone { return new(messages.PullDone) })
	if _, err := e.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: prm, EngineId: e.id, RegionId: e.rid, BlockIds: dst, PullId: id}); err != nil {
		t.Fatalf("start pull %s on %s: %v", id, on, err)
	}
	return done.wait(t, total, func(m *messages.PullDone) bool { return m.PullId == id })
}

// TestHostsPullAcrossHosts: members on three hosts against a three-node NATS
// cluster; a decode host pulls a hold from the prefill host over the TCP
// data plane, between two addresses of the lab, and the request bucket has
// three replicas.
func TestHostsPullAcrossHosts(t *testing.T) {
	c := newHostPD(t, 3)
	prm := c.hold(t, []uint32{1, 2, 3}, 48)
	h1 := c.lab.Hosts[0]
	if !strings.HasPrefix(c.prefill.dataAddr, h1.IP+":") {
		t.Fatalf("the prefill member's data address %q is not on its host %s", c.prefill.dataAddr, h1.IP)
	}
	for i, d := range []string{"d2", "d3"} {
		h := c.lab.Hosts[i+1]
		rx0, err := h.RxBytes()
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		n := c.pullOn(t, d, "x-"+d, prm, []uint32{5, 6, 7}, 10*time.Second)
		if !n.Ok {
			t.Fatalf("pull on %s: %v", d, n)
		}
		rx1, err := h.RxBytes()
		if err != nil {
			t.Fatal(err)
		}
		if rx1-rx0 < n.Bytes {
			t.Fatalf("%s received %d bytes during a %d-byte pull: it did not cross the network", h.Name, rx1-rx0, n.Bytes)
		}
		t.Logf("%s pulled %d bytes from h1 in %s (%s received %d)", d, n.Bytes, time.Since(start).Round(time.Millisecond), h.Name, rx1-rx0)
		verifyBlocks(t, c.engP.region, c.engines[d].region, []uint32{1, 2, 3}, []uint32{5, 6, 7}, nil)
	}
	info, err := bucketInfo(ctx5(t), c.ncs["d2"])
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Replicas != 3 || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("request bucket: replicas %d, cluster %+v", info.Config.Replicas, info.Cluster)
	}
}

// pullLoad keeps one decode engine pulling the same hold, pull after pull,
// through a client connection of its own; every pull is checked (ok, bytes
// verified). A pull.start that finds no responder (the member is between
// NATS servers) or gets no answer (lost with a server) is sent again with
// the same pull id, as the engine shim does: connexd treats it as the same
// pull.
type pullLoad struct {
	name     string
	ok       int
	failures []string
	slowest  time.Duration
	stop     chan struct{}
	done     chan struct{}
}

func (c *hostPD) startPullLoad(t *testing.T, on string, nc *nats.Conn, prm *messages.KVTransferParams, src, dst []uint32) *pullLoad {
	e := c.engines[on]
	cli := &api.Client{NC: nc, Member: on}
	notes := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(api.PullDoneSubject(e.id), notes)
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
				l.ok++
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
	t.Logf("load on %s: %d pulls ok, slowest %s, %d failed", l.name, l.ok, l.slowest.Round(time.Millisecond), len(l.failures))
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
	src := []uint32{1, 2, 3, 4, 5, 6, 7, 8}
	prm := c.hold(t, src, 128)
	p := prompt(128)
	for d, toks := range map[string][]uint32{"d2": {7, 8}, "d3": {9}} {
		e := c.engines[d]
		if _, err := e.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-" + d, Params: prm, PromptTokenIds: p, EngineId: e.id}); err != nil {
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
		c.startPullLoad(t, "d2", ncStable, prm, src, []uint32{10, 11, 12, 13, 14, 15, 16, 17}),
		c.startPullLoad(t, "d3", ncStable, prm, src, []uint32{20, 21, 22, 23, 24, 25, 26, 27}),
	}
	// Some pulls before the kill, and a while of them after it.
	checkFor(t, 20*time.Second, 10*time.Millisecond, func() error {
		if loads[0].ok < 5 || loads[1].ok < 5 {
			return fmt.Errorf("pulls ok before the kill: %d, %d", loads[0].ok, loads[1].ok)
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
	before := loads[0].ok + loads[1].ok
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
		if n := loads[0].ok + loads[1].ok; n < before+20 {
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
	hs, err := c.engP.cli.Inspect(ctx5(t), &messages.HoldRef{TransferId: prm.TransferId})
	if err != nil || hs.State != "held" {
		t.Fatalf("hold after the kill: %v %v", hs, err)
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

// TestHostsDecodeHostIsolated cuts a decode host off from the other hosts
// (its NATS server with it: the minority side of the cluster) while it runs
// a request: the request is adopted on the majority side with its tokens,
// the adopter pulls the same hold from the prefill host (no second
// prefill), the isolated side cannot write the request, and once the
// partition heals the isolated member's write is fenced and its engine told
// so.
func TestHostsDecodeHostIsolated(t *testing.T) {
	c := newHostPD(t, 3)
	src := []uint32{2, 3, 4, 5}
	prm := c.hold(t, src, 64)
	p := prompt(64)
	d2 := c.engines["d2"]
	if _, err := d2.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-iso", Params: prm, PromptTokenIds: p, EngineId: d2.id}); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.cli.Progress(ctx5(t), &messages.RequestProgress{RequestId: "r-iso", Epoch: 1, TokenIds: []uint32{7, 8, 9}}); err != nil {
		t.Fatal(err)
	}
	res := subscribe(t, c.ncs["d3"], "connex.v1.engine.*.request.resume", func() *messages.ResumeNotice { return new(messages.ResumeNotice) })
	h2 := c.lab.Hosts[1]
	isolated := time.Now()
	if err := h2.Isolate(); err != nil {
		t.Fatal(err)
	}
	n := res.wait(t, 30*time.Second, func(m *messages.ResumeNotice) bool { return m.State.RequestId == "r-iso" })
	t.Logf("isolate h2 -> resume notice: %s, now on %s", time.Since(isolated).Round(time.Millisecond), n.State.Owner)
	st := n.State
	if st.Owner != "d3" || st.Epoch != 2 || !slices.Equal(st.GeneratedTokenIds, []uint32{7, 8, 9}) || !slices.Equal(st.PromptTokenIds, p) || st.Params.TransferId != prm.TransferId {
		t.Fatalf("adopted state: %v", st)
	}
	dst := []uint32{10, 11, 12, 13}
	if d := c.pullOn(t, "d3", "after-isolation", st.Params, dst, 10*time.Second); !d.Ok {
		t.Fatalf("adopter's pull of the same hold: %v", d)
	}
	verifyBlocks(t, c.engP.region, c.engines["d3"].region, src, dst, nil)
	if _, err := c.engines["d3"].cli.Progress(ctx5(t), &messages.RequestProgress{RequestId: "r-iso", Epoch: 2, TokenIds: []uint32{10}}); err != nil {
		t.Fatalf("progress on the adopter: %v", err)
	}
	// The minority side has no JetStream quorum: the isolated member's
	// write fails.
	if _, err := d2.cli.Progress(ctx5(t), &messages.RequestProgress{RequestId: "r-iso", Epoch: 1, TokenIds: []uint32{66}}); err == nil {
		t.Fatal("the isolated member wrote the request")
	} else {
		t.Logf("isolated member's progress: %v (code %d)", err, api.CodeOf(err))
	}
	fenced := subscribe(t, c.ncs["d2"], api.FencedSubject(d2.id), func() *messages.FencedNotice { return new(messages.FencedNotice) })
	healed := time.Now()
	if err := h2.Heal(); err != nil {
		t.Fatal(err)
	}
	// Once NATS routes are back, the stale owner's write is fenced.
	checkFor(t, 60*time.Second, 200*time.Millisecond, func() error {
		_, err := d2.cli.Progress(ctx5(t), &messages.RequestProgress{RequestId: "r-iso", Epoch: 1, TokenIds: []uint32{99}})
		if api.CodeOf(err) != api.CodeFenced {
			return fmt.Errorf("stale owner's progress after the heal: %v", err)
		}
		return nil
	})
	t.Logf("heal -> stale owner fenced: %s", time.Since(healed).Round(time.Millisecond))
	f := fenced.wait(t, 10*time.Second, func(m *messages.FencedNotice) bool { return m.RequestId == "r-iso" })
	if f.NewOwner != "d3" || f.StaleEpoch != 1 {
		t.Fatalf("fenced notice %v", f)
	}
	cur, err := c.engines["d3"].cli.InspectRequest(ctx5(t), &messages.RequestRef{RequestId: "r-iso"})
	if err != nil || cur.State.Owner != "d3" || cur.State.Epoch != 2 || !slices.Equal(cur.State.GeneratedTokenIds, []uint32{7, 8, 9, 10}) {
		t.Fatalf("state after the heal: %v %v", cur, err)
	}
	c.waitMembers(3)
	hs, err := c.engP.cli.Inspect(ctx5(t), &messages.HoldRef{TransferId: prm.TransferId})
	if err != nil || hs.State != "held" {
		t.Fatalf("hold after the partition: %v %v", hs, err)
	}
}

// TestHostsDataPlanePartition cuts only the data plane between a decode host
// and the prefill host (nftables drops on the prefill member's data port,
// both ways); NATS between them still works. connexd does not retry such a
// pull: it fails it with a clear code within pull_stall_ms, and the hold
// stays, so that the engine's retry, or a resume on a decode host that
// reaches the prefill host, reads the same KV without a second prefill.
func TestHostsDataPlanePartition(t *testing.T) {
	c := newHostPD(t, 3)
	src := []uint32{1, 2, 3, 4}
	prm := c.hold(t, src, 64)
	h1, h2 := c.lab.Hosts[0], c.lab.Hosts[1]
	port := netlab.Port(c.prefill.dataAddr)
	if err := h2.AddDrop(netlab.Drop{To: h1, Port: port}); err != nil {
		t.Fatal(err)
	}
	if err := h1.AddDrop(netlab.Drop{To: h2, Port: port}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	d := c.pullOn(t, "d2", "cut", prm, []uint32{8, 9, 10, 11}, 30*time.Second)
	if d.Ok || d.ErrorCode == 0 || d.Error == "" {
		t.Fatalf("pull across the cut data plane: %v", d)
	}
	t.Logf("pull across the cut data plane failed after %s: code %d (%s): %s", time.Since(t0).Round(time.Millisecond), d.ErrorCode, api.Code(d.ErrorCode).Name(), d.Error)
	// The control plane between the two hosts still works: the decode
	// host's engine reads the hold on the prefill member.
	holder := &api.Client{NC: c.ncs["d2"], Member: "p1"}
	if hs, err := holder.Inspect(ctx5(t), &messages.HoldRef{TransferId: prm.TransferId}); err != nil || hs.State != "held" {
		t.Fatalf("hold seen from the cut host: %v %v", hs, err)
	}
	// Another decode host reaches the prefill host meanwhile.
	if d := c.pullOn(t, "d3", "other-host", prm, []uint32{8, 9, 10, 11}, 10*time.Second); !d.Ok {
		t.Fatalf("pull from the other decode host: %v", d)
	}
	verifyBlocks(t, c.engP.region, c.engines["d3"].region, src, []uint32{8, 9, 10, 11}, nil)
	if err := h2.ClearDrops(); err != nil {
		t.Fatal(err)
	}
	if err := h1.ClearDrops(); err != nil {
		t.Fatal(err)
	}
	if d := c.pullOn(t, "d2", "retry", prm, []uint32{8, 9, 10, 11}, 10*time.Second); !d.Ok {
		t.Fatalf("retry after the data plane is back: %v", d)
	}
	verifyBlocks(t, c.engP.region, c.engines["d2"].region, src, []uint32{8, 9, 10, 11}, nil)
}

// hostsLayout is 16 MiB per 32 blocks: enough bytes for loss and delay to
// show in a pull's time.
var hostsLayout = kvmem.Layout{Layers: 4, Planes: 2, Blocks: 64, BlockBytes: 64 << 10, BlockSize: 16, TPSize: 1}

// TestHostsLossAndDelay pulls 16 MiB from the prefill host to a decode host
// on a clean path, with 5 % of the data plane's packets dropped each way
// (nftables), and through a relay that delays each direction by 50 ms (the
// prefill member advertises it as its data address); every pull succeeds
// with the hold's bytes, and the note has their times.
func TestHostsLossAndDelay(t *testing.T) {
	l := newHostLab(t, 3)
	h1, h2 := l.lab.Hosts[0], l.lab.Hosts[1]
	relay, err := netlab.NewRelay(l.lab.Gateway()+":0", h1.Addr(7411), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = relay.Close() })
	c := l.startPD()
	l.connexd(h1, "p1d", "--role", "prefill", "--data-listen", h1.Addr(7411), "--data-advertise", relay.Addr())
	direct := newEngine(t, c.ncs["p1"], "p1", "engDirect", hostsLayout, true)
	relayed := newEngine(t, c.ncs["p1"], "p1d", "engRelayed", hostsLayout, true)
	dst := newEngine(t, c.ncs["d2"], "d2", "engBig", hostsLayout, false)
	c.engines["big"] = dst
	blocks := make([]uint32, 32)
	for i := range blocks {
		blocks[i] = uint32(i)
	}
	pull := func(from *engine, id string) time.Duration {
		t.Helper()
		h, err := from.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: from.id, RegionId: from.rid, BlockIds: blocks, NumTokens: 512})
		if err != nil {
			t.Fatal(err)
		}
		done := subscribe(t, c.ncs["d2"], api.PullDoneSubject(dst.id), func() *messages.PullDone { return new(messages.PullDone) })
		t0 := time.Now()
		if _, err := dst.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: h.Params, EngineId: dst.id, RegionId: dst.rid, BlockIds: blocks, PullId: id}); err != nil {
			t.Fatal(err)
		}
		d := done.wait(t, 60*time.Second, func(m *messages.PullDone) bool { return m.PullId == id })
		took := time.Since(t0)
		if !d.Ok {
			t.Fatalf("pull %s: %v", id, d)
		}
		verifyBlocks(t, from.region, dst.region, blocks, blocks, nil)
		t.Logf("%-22s 16 MiB in %7s (%.2f Gbit/s)", id, took.Round(time.Millisecond), float64(d.Bytes)*8/took.Seconds()/1e9)
		return took
	}
	pull(direct, "clean")
	port := netlab.Port(c.prefill.dataAddr)
	for _, drop := range []struct{ on, to *netlab.Host }{{h1, h2}, {h2, h1}} {
		if err := drop.on.AddDrop(netlab.Drop{To: drop.to, Port: port, Percent: 5}); err != nil {
			t.Fatal(err)
		}
	}
	pull(direct, "5%-loss")
	for _, h := range []*netlab.Host{h1, h2} {
		n, err := h.Dropped()
		if err != nil {
			t.Fatal(err)
		}
		if h == h1 && n == 0 {
			t.Fatal("the 5% loss dropped none of the holder's packets")
		}
		t.Logf("%s dropped %d packets of the pull", h.Name, n)
		if err := h.ClearDrops(); err != nil {
			t.Fatal(err)
		}
	}
	pull(relayed, "relay-no-delay")
	relay.SetDelay(50 * time.Millisecond)
	pull(relayed, "relay-50ms-each-way")
}

// TestHostsClockSkew runs the prefill member with its wall clock 30 s
// behind and a decode member with its clock 45 s ahead
// (daemon.ClockSkewEnv), with 2 s leases: a pull across them works, the
// running request keeps its hold alive well past one lease, the request
// fails over to an unskewed member that pulls the same hold again, the
// finish frees the hold, and a hold nobody renews expires after its lease,
// not at once nor never. Leases and TTLs are durations on the member that
// keeps them; no decision compares two members' clocks.
func TestHostsClockSkew(t *testing.T) {
	l := newHostLab(t, 3)
	h1, h2, h3 := l.lab.Hosts[0], l.lab.Hosts[1], l.lab.Hosts[2]
	c := &hostPD{hostLab: l, procs: map[string]*proc{}, engines: map[string]*engine{}, ncs: map[string]*nats.Conn{}}
	c.prefill = l.connexdWith(h1, "p1", []string{daemon.ClockSkewEnv + "=-30s"}, "--role", "prefill", "--retain-s", "2")
	c.procs["p1"] = c.prefill
	c.procs["d2"] = l.connexdWith(h2, "d2", []string{daemon.ClockSkewEnv + "=45s"}, "--role", "decode")
	c.procs["d3"] = l.connexd(h3, "d3", "--role", "decode")
	for name, h := range map[string]*netlab.Host{"p1": h1, "d2": h2, "d3": h3} {
		c.ncs[name] = l.conn(h)
	}
	c.engP = newEngine(t, c.ncs["p1"], "p1", "engP", testLayout, true)
	for _, d := range []string{"d2", "d3"} {
		c.engines[d] = newEngine(t, c.ncs[d], d, "eng-"+d, testLayout, false)
	}
	c.waitMembers(3)
	if !strings.Contains(c.prefill.logs(), "wall clock is shifted") {
		t.Fatal("the prefill member did not take the clock skew")
	}

	src := []uint32{1, 2, 3, 4}
	prm := c.hold(t, src, 64)
	created := time.Now()
	if d := c.pullOn(t, "d2", "skewed", prm, []uint32{5, 6, 7, 8}, 10*time.Second); !d.Ok {
		t.Fatalf("pull between skewed members: %v", d)
	}
	verifyBlocks(t, c.engP.region, c.engines["d2"].region, src, []uint32{5, 6, 7, 8}, nil)
	d2 := c.engines["d2"]
	if _, err := d2.cli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-skew", Params: prm, PromptTokenIds: prompt(64), EngineId: d2.id}); err != nil {
		t.Fatal(err)
	}
	if _, err := d2.cli.Progress(ctx5(t), &messages.RequestProgress{RequestId: "r-skew", Epoch: 1, TokenIds: []uint32{7, 8}}); err != nil {
		t.Fatal(err)
	}
	// The running request renews the hold: it is held for three leases.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for time.Since(created) < 6*time.Second {
		hs, err := c.engP.cli.Inspect(ctx5(t), &messages.HoldRef{TransferId: prm.TransferId})
		if err != nil || hs.State != "held" {
			t.Fatalf("hold %s after creation, with its request running: %v %v", time.Since(created).Round(time.Millisecond), hs, err)
		}
		<-tick.C
	}
	res := subscribe(t, c.ncs["d3"], "connex.v1.engine.*.request.resume", func() *messages.ResumeNotice { return new(messages.ResumeNotice) })
	c.procs["d2"].kill()
	n := res.wait(t, 20*time.Second, func(m *messages.ResumeNotice) bool { return m.State.RequestId == "r-skew" })
	if n.State.Owner != "d3" || n.State.Epoch != 2 || !slices.Equal(n.State.GeneratedTokenIds, []uint32{7, 8}) {
		t.Fatalf("adopted state: %v", n.State)
	}
	if d := c.pullOn(t, "d3", "adopted", n.State.Params, []uint32{5, 6, 7, 8}, 10*time.Second); !d.Ok {
		t.Fatalf("adopter's pull: %v", d)
	}
	freed := subscribe(t, c.ncs["p1"], api.FreedSubject(c.engP.id), func() *messages.BlocksFreed { return new(messages.BlocksFreed) })
	if _, err := c.engines["d3"].cli.FinishRequest(ctx5(t), &messages.FinishRequestMsg{RequestId: "r-skew", Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	freed.wait(t, 10*time.Second, func(m *messages.BlocksFreed) bool { return m.TransferId == prm.TransferId })

	// A hold nobody pulls or renews ends with its lease.
	lone := c.hold(t, []uint32{9}, 16)
	born := time.Now()
	checkFor(t, 20*time.Second, 50*time.Millisecond, func() error {
		hs, err := c.engP.cli.Inspect(ctx5(t), &messages.HoldRef{TransferId: lone.TransferId})
		if err == nil && hs.State == "held" {
			return fmt.Errorf("still held")
		}
		return nil
	})
	lived := time.Since(born)
	if lived < 2*time.Second {
		t.Fatalf("a 2 s lease ended after %s", lived.Round(time.Millisecond))
	}
	t.Logf("an unrenewed 2 s lease on the member 30 s behind ended after %s", lived.Round(time.Millisecond))
}

// TestHostsUCXOverTCP pulls between hosts with the UCX data plane over its
// TCP transport (UCX_TLS=tcp,self: what UCX has between machines without
// RDMA), in checked and in one-sided reads. Skipped in a build without
// -tags ucx.
func TestHostsUCXOverTCP(t *testing.T) {
	if buildTags() != "ucx" {
		t.Skip("connexd built without -tags ucx (libucx not installed)")
	}
	for _, reads := range []string{"checked", "onesided"} {
		t.Run(reads, func(t *testing.T) {
			l := newHostLab(t, 3)
			h1, h2 := l.lab.Hosts[0], l.lab.Hosts[1]
			env := []string{"UCX_TLS=tcp,self", "UCX_NET_DEVICES=eth0"}
			args := []string{"--backend", "ucx", "--ucx-reads", reads}
			l.connexdMachine(h1, "p1", env, append(args, "--role", "prefill")...)
			l.connexdMachine(h2, "d2", env, append(args, "--role", "decode")...)
			pe := newEngine(t, l.conn(h1), "p1", "engP", testLayout, true)
			nc2 := l.conn(h2)
			de := newEngine(t, nc2, "d2", "engD", testLayout, false)
			h, err := pe.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pe.id, RegionId: pe.rid, BlockIds: []uint32{1, 2, 3}, NumTokens: 48})
			if err != nil {
				t.Fatal(err)
			}
			done := subscribe(t, nc2, api.PullDoneSubject(de.id), func() *messages.PullDone { return new(messages.PullDone) })
			rx0, err := h2.RxBytes()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := de.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: h.Params, EngineId: de.id, RegionId: de.rid, BlockIds: []uint32{4, 5, 6}, PullId: "ucx"}); err != nil {
				t.Fatal(err)
			}
			d := done.wait(t, 20*time.Second, func(m *messages.PullDone) bool { return m.PullId == "ucx" })
			if !d.Ok {
				t.Fatalf("UCX pull between hosts: %v", d)
			}
			verifyBlocks(t, pe.region, de.region, []uint32{1, 2, 3}, []uint32{4, 5, 6}, nil)
			// The bytes came over the decode host's interface (no CMA
			// shortcut between hosts).
			rx1, err := h2.RxBytes()
			if err != nil {
				t.Fatal(err)
			}
			if rx1-rx0 < d.Bytes {
				t.Fatalf("h2 received %d bytes during a %d-byte pull: the pull did not cross the network", rx1-rx0, d.Bytes)
			}
			t.Logf("%s: %d bytes pulled, h2 received %d", reads, d.Bytes, rx1-rx0)
		})
	}
}
