package e2e

import (
	"os"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// truncateCase is one way an engine shrinks a region under a pull.
type truncateCase struct {
	name    string
	backend string
	args    []string // for both connexd
	created bool     // the truncated region is region.create's, else a registered file
	dst     bool     // the decode engine truncates its destination, else the prefill engine its source
	// broken: the fault happens in the victim's own connexd, which then
	// answers region_broken for the region until it is made again. (A
	// one-sided CMA read gets EFAULT, no fault; a reader copying from a
	// holder's segment faults in the reader's connexd.)
	broken bool
	code   api.Code // what the failed pull says
}

func truncateCases() []truncateCase {
	cs := []truncateCase{
		{name: "tcp/src-file", backend: "tcp", code: api.CodeRegionBroken},
		{name: "tcp/dst-file", backend: "tcp", dst: true, code: api.CodeRegionBroken},
	}
	if buildTags() != "ucx" {
		return cs
	}
	checked, onesided := []string{"--ucx-reads", "checked"}, []string{"--ucx-reads", "onesided"}
	return append(cs,
		truncateCase{name: "ucx-checked/src-file", backend: "ucx", args: checked, broken: true, code: api.CodeRegionBroken},
		truncateCase{name: "ucx-checked/dst-file", backend: "ucx", args: checked, dst: true, broken: true, code: api.CodeRegionBroken},
		// process_vm_readv gets EFAULT: the range is not there to read.
		truncateCase{name: "ucx-onesided/src-file", backend: "ucx", args: onesided, code: api.CodeTransferFailed},
		truncateCase{name: "ucx-onesided/dst-file", backend: "ucx", args: onesided, dst: true, code: api.CodeTransferFailed},
		// UCX's POSIX shared memory, which cannot be sealed: the reader
		// copies from its own mapping of the holder's segment.
		truncateCase{name: "ucx-shared/src-created", backend: "ucx", created: true, code: api.CodeRegionBroken},
		truncateCase{name: "ucx-shared/dst-created", backend: "ucx", created: true, dst: true, broken: true, code: api.CodeRegionBroken},
		truncateCase{name: "ucx-shared-get/src-created", backend: "ucx", args: []string{"--ucx-shared-reads", "get"}, created: true, code: api.CodeRegionBroken},
	)
}

// TestTruncatedRegionFailsThePullNotConnexd: an engine shrinks its region
// (the prefill engine its source, or the decode engine its destination)
// while a pull reads from or into it, on every data plane and read path.
// The pull fails with a clear error; both connexd live, the broken region
// answers region_lost from then on, and another engine's pull through the
// same two connexd still moves every byte.
func TestTruncatedRegionFailsThePullNotConnexd(t *testing.T) {
	for _, c := range truncateCases() {
		t.Run(c.name, func(t *testing.T) { truncatedRegion(t, c) })
	}
}

func truncatedRegion(t *testing.T, c truncateCase) {
	pn := startConnexd(t, "prefill", append([]string{"--backend", c.backend}, c.args...)...)
	dn := startConnexd(t, "decode", append([]string{"--backend", c.backend, "--nats-url", pn.natsURL}, c.args...)...)
	nc := connect(t, pn.natsURL)
	mk := func(member, id string, fill, victim bool) *engine {
		if c.created && victim {
			e, _ := newCreatedEngine(t, nc, member, id, testLayout, fill)
			return e
		}
		return newEngine(t, nc, member, id, testLayout, fill)
	}
	pre := mk("prefill", "engP", true, !c.dst)
	dec := mk("decode", "engD", false, c.dst)
	victim := map[bool]*engine{false: pre, true: dec}[c.dst]

	h, err := pre.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pre.id, RegionId: pre.rid, BlockIds: []uint32{20, 21, 22, 23}, NumTokens: 64})
	if err != nil {
		t.Fatal(err)
	}
	// The victim's region now ends before the blocks the pull touches.
	if err := os.Truncate(victimPath(t, victim), 4096); err != nil {
		t.Fatal(err)
	}
	done := subscribe(t, nc, api.PullDoneSubject(dec.cli.Member, dec.id), func() *messages.PullDone { return new(messages.PullDone) })
	if _, err := dec.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: h.Params, EngineId: dec.id, RegionId: dec.rid, BlockIds: []uint32{1, 2, 3, 4}, PullId: "trunc"}); err != nil {
		t.Fatal(err)
	}
	d := done.wait(t, 20*time.Second, func(m *messages.PullDone) bool { return m.PullId == "trunc" })
	if d.Ok || api.Code(d.ErrorCode) != c.code {
		t.Fatalf("a pull with a truncated region: ok=%v %s (%d), want code %d", d.Ok, d.Error, d.ErrorCode, c.code)
	}
	t.Logf("pull with a truncated region: %s (%d)", d.Error, d.ErrorCode)
	for _, p := range []*proc{pn, dn} {
		if !p.running() {
			t.Fatalf("connexd %s died:\n%s", p.member, p.logs())
		}
	}
	if c.broken {
		victimRecovers(t, c, pre, dec, victim, h)
	}

	// Two more engines, one on each connexd: a pull between them moves
	// every byte.
	pre2 := newEngine(t, nc, "prefill", "engP2", testLayout, true)
	dec2 := newEngine(t, nc, "decode", "engD2", testLayout, false)
	h2, err := pre2.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pre2.id, RegionId: pre2.rid, BlockIds: []uint32{5, 6}, NumTokens: 32})
	if err != nil {
		t.Fatal(err)
	}
	done2 := subscribe(t, nc, api.PullDoneSubject(dec2.cli.Member, dec2.id), func() *messages.PullDone { return new(messages.PullDone) })
	if _, err := dec2.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: h2.Params, EngineId: dec2.id, RegionId: dec2.rid, BlockIds: []uint32{7, 8}, PullId: "after"}); err != nil {
		t.Fatal(err)
	}
	if d := done2.wait(t, 20*time.Second, func(m *messages.PullDone) bool { return m.PullId == "after" }); !d.Ok {
		t.Fatalf("a pull between other engines after the truncation: %s (%d)", d.Error, d.ErrorCode)
	}
	verifyBlocks(t, pre2.region, dec2.region, []uint32{5, 6}, []uint32{7, 8}, []uint32{0, 1, 2})
}

// victimRecovers checks that the victim's connexd refuses its broken
// region with region_broken, and that making the region again (creating
// it, or registering the file restored to its size) gives a region a pull
// moves every byte through.
func victimRecovers(t *testing.T, c truncateCase, pre, dec, victim *engine, h *messages.CreateHoldReply) {
	t.Helper()
	var err error
	if c.dst {
		_, err = dec.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: h.Params, EngineId: dec.id, RegionId: dec.rid, BlockIds: []uint32{1, 2, 3, 4}, PullId: "again"})
	} else {
		_, err = pre.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pre.id, RegionId: pre.rid, BlockIds: []uint32{1}, NumTokens: 16})
	}
	if api.CodeOf(err) != api.CodeRegionBroken {
		t.Fatalf("using the broken region again: %v, want code %d (region_broken)", err, api.CodeRegionBroken)
	}
	// The engine makes its region again, as the engine shim does on
	// region_broken.
	if c.created {
		again, _ := newCreatedEngineAs(t, victim.cli, victim.id, testLayout, !c.dst)
		*victim = *again
	} else {
		if err := os.Truncate(victim.region.Path, int64(testLayout.Size())); err != nil {
			t.Fatal(err)
		}
		again := newEngineAt(t, victim.cli, victim.id, victim.region.Path, testLayout, !c.dst)
		*victim = *again
	}
	h2, err := pre.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pre.id, RegionId: pre.rid, BlockIds: []uint32{9, 10}, NumTokens: 32})
	if err != nil {
		t.Fatalf("a hold after the region was made again: %v", err)
	}
	done := subscribe(t, dec.cli.NC, api.PullDoneSubject(dec.cli.Member, dec.id), func() *messages.PullDone { return new(messages.PullDone) })
	if _, err := dec.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: h2.Params, EngineId: dec.id, RegionId: dec.rid, BlockIds: []uint32{11, 12}, PullId: "remade"}); err != nil {
		t.Fatal(err)
	}
	if d := done.wait(t, 20*time.Second, func(m *messages.PullDone) bool { return m.PullId == "remade" }); !d.Ok {
		t.Fatalf("a pull after the region was made again: %s (%d)", d.Error, d.ErrorCode)
	}
	verifyBlocks(t, pre.region, dec.region, []uint32{9, 10}, []uint32{11, 12}, nil)
}

// victimPath is the path through which the victim engine can shrink its
// region: its own file, or the /proc path of connexd's created memory.
func victimPath(t *testing.T, e *engine) string {
	t.Helper()
	if e.region == nil || e.region.Path == "" {
		t.Fatalf("engine %s has no region path", e.id)
	}
	return e.region.Path
}
