package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

// bigLayout is 1 GiB per region: long enough a pull to be interrupted.
// The regions are never written, so tmpfs keeps them as holes.
var bigLayout = kvmem.Layout{Layers: 8, Planes: 2, Blocks: 256, BlockBytes: 256 << 10, BlockSize: 16, TPSize: 1}

func backends() []string {
	if buildTags() == "ucx" {
		return []string{"tcp", "ucx"}
	}
	return []string{"tcp"}
}

// holdEveryBlock holds every block of pe's bigLayout region.
func holdEveryBlock(t *testing.T, pe *engine) ([]uint32, *messages.CreateHoldReply) {
	t.Helper()
	ids := make([]uint32, bigLayout.Blocks)
	for i := range ids {
		ids[i] = uint32(i)
	}
	hold, err := pe.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pe.id, RegionId: pe.rid, BlockIds: ids})
	if err != nil {
		t.Fatal(err)
	}
	return ids, hold
}

// TestHolderDiesDuringPull SIGKILLs, or SIGSTOPs, the prefill-side connexd
// while a pull reads from it, and checks that the pull ends with a clear
// error well before its end-to-end deadline (ended by the stall deadline,
// pull_stall_ms, or for a killed holder by peer_unavailable),
// that the decode-side connexd keeps running, and that no destination
// block stays claimed.
func TestHolderDiesDuringPull(t *testing.T) {
	for _, backend := range backends() {
		for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP} {
			t.Run(fmt.Sprintf("%s/%s", backend, sig), func(t *testing.T) { holderDies(t, backend, sig) })
		}
	}
}

func holderDies(t *testing.T, backend string, sig syscall.Signal) {
	url := startNATS(t)
	pn := startConnexd(t, "holder", "--backend", backend, "--nats-url", url)
	dn := startConnexd(t, "reader", "--backend", backend, "--nats-url", url)
	nc := connect(t, url)
	pe := newEngine(t, nc, "holder", "engP", bigLayout, false)
	de := newEngine(t, nc, "reader", "engD", bigLayout, false)
	done := subscribe(t, nc, api.PullDoneSubject(de.cli.Member, de.id), func() *messages.PullDone { return new(messages.PullDone) })
	ids, hold := holdEveryBlock(t, pe)
	var sent time.Time
	var pullID string
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			t.Fatal("every pull finished before the holder could be signalled")
		}
		pullID = fmt.Sprintf("p%d", attempt)
		if _, err := de.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: hold.Params, EngineId: de.id, RegionId: de.rid, BlockIds: ids, PullId: pullID}); err != nil {
			t.Fatal(err)
		}
		checkFor(t, 5*time.Second, time.Millisecond, func() error {
			st, err := pe.cli.Inspect(ctx5(t), &messages.HoldRef{TransferId: hold.Params.TransferId})
			if err != nil || st.ActivePulls == 0 {
				return fmt.Errorf("pull %s not active on the holder: %v %v", pullID, st, err)
			}
			return nil
		})
		pn.signal(sig)
		sent = time.Now()
		// If the pull had already finished, try again on a fresh pull.
		d := done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == pullID })
		if !d.Ok {
			elapsed := time.Since(sent)
			t.Logf("%s: pull ended %s after the signal: code %d (%s): %s", sig, elapsed.Round(time.Millisecond), d.ErrorCode, api.Code(d.ErrorCode).Name(), d.Error)
			if d.KvLoadFailurePolicy != "fail" {
				t.Fatalf("PullDone must carry the daemon's kv_load_failure_policy, got %q", d.KvLoadFailurePolicy)
			}
			switch api.Code(d.ErrorCode) {
			case api.CodePeerUnavailable, api.CodeTimeout, api.CodeTransferFailed:
			default:
				t.Fatalf("unexpected error code %d: %s", d.ErrorCode, d.Error)
			}
			// A killed holder is a dead peer, not a slow one, on both
			// backends: TCP sees the connection refused, and over UCX's
			// shared-memory lanes (no peer error handling) the cluster's
			// failure detector removes the holder within milliseconds and
			// ends its pulls (pull.HolderWatch), well before the stall
			// deadline would say timeout.
			if sig == syscall.SIGKILL && api.Code(d.ErrorCode) != api.CodePeerUnavailable {
				t.Fatalf("killed holder: code %d (%s), want peer_unavailable: %s", d.ErrorCode, api.Code(d.ErrorCode).Name(), d.Error)
			}
			// No wall-clock bound here: done.wait above gives the pull 10 s,
			// a third of pull_timeout_ms (30 s), so a pull ended by the end-to-end
			// deadline instead of the stall deadline (1 s) or the failure
			// detector fails the test; the time it took is logged above.
			break
		}
		if sig == syscall.SIGSTOP {
			pn.signal(syscall.SIGCONT)
		} else {
			t.Fatalf("pull completed although the holder was killed (%s after the signal)", time.Since(sent))
		}
	}
	if !dn.running() {
		t.Fatalf("decode connexd died:\n%s", dn.logs())
	}
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		ri, err := de.cli.InspectRegion(ctx5(t), &messages.RegionRef{EngineId: de.id, RegionId: de.rid})
		if err != nil {
			return err
		}
		if ri.BlocksWriting != 0 {
			return fmt.Errorf("%d destination blocks still claimed", ri.BlocksWriting)
		}
		return nil
	})
	if sig == syscall.SIGSTOP {
		pn.signal(syscall.SIGCONT)
	}
}

// TestReaderShutdownDuringPull sends SIGTERM to the decode-side connexd
// while it pulls: it must cancel the pull, tell the engine (PullDone with
// an error, before it exits), tell the holder (PullEnd: the holder stops
// counting the pull at once, not at the pull's deadline 30 s later) and
// exit promptly.
func TestReaderShutdownDuringPull(t *testing.T) {
	url := startNATS(t)
	startConnexd(t, "holder", "--backend", "tcp", "--nats-url", url)
	nc := connect(t, url)
	pe := newEngine(t, nc, "holder", "engP", bigLayout, false)
	ids, hold := holdEveryBlock(t, pe)
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			t.Fatal("every pull finished before the reader could be stopped")
		}
		dn := startConnexd(t, fmt.Sprintf("reader%d", attempt), "--backend", "tcp", "--nats-url", url)
		de := newEngine(t, nc, dn.member, fmt.Sprintf("engD%d", attempt), bigLayout, false)
		pullID := fmt.Sprintf("p%d", attempt)
		done := startPullOnHolder(t, nc, pe, de, hold, ids, pullID)
		dn.signal(syscall.SIGTERM)
		sent := time.Now()
		d := done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == pullID })
		if d.Ok {
			continue // finished before the signal landed: try again
		}
		t.Logf("pull ended %s after SIGTERM: code %d (%s): %s", time.Since(sent).Round(time.Millisecond), d.ErrorCode, api.Code(d.ErrorCode).Name(), d.Error)
		if api.Code(d.ErrorCode) != api.CodeTransferFailed {
			t.Fatalf("unexpected error code %d: %s", d.ErrorCode, d.Error)
		}
		select {
		case <-dn.exited:
		case <-time.After(5 * time.Second):
			t.Fatalf("reader still running 5 s after SIGTERM")
		}
		holderCountsNoPull(t, pe, hold)
		return
	}
}

// TestEngineGoneDuringPullEndsIt: engine.gone of the engine a pull writes
// into ends the pull at once (PullDone with an error, the holder told), not
// at its deadline: a new instance of the engine may register the same
// region file, and no pull of the old one may go on writing it.
func TestEngineGoneDuringPullEndsIt(t *testing.T) {
	url := startNATS(t)
	startConnexd(t, "holder", "--backend", "tcp", "--nats-url", url)
	nc := connect(t, url)
	pe := newEngine(t, nc, "holder", "engP", bigLayout, false)
	ids, hold := holdEveryBlock(t, pe)
	dn := startConnexd(t, "reader", "--backend", "tcp", "--nats-url", url)
	for attempt := 0; ; attempt++ {
		if attempt == 5 {
			t.Fatal("every pull finished before engine.gone landed")
		}
		de := newEngine(t, nc, dn.member, fmt.Sprintf("engD%d", attempt), bigLayout, false)
		pullID := fmt.Sprintf("p%d", attempt)
		done := startPullOnHolder(t, nc, pe, de, hold, ids, pullID)
		sent := time.Now()
		if _, err := de.cli.EngineGone(ctx5(t), &messages.EngineGoneRequest{EngineId: de.id}); err != nil {
			t.Fatal(err)
		}
		d := done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == pullID })
		if d.Ok {
			continue // finished before engine.gone landed: try again
		}
		t.Logf("pull ended %s after engine.gone: code %d (%s): %s", time.Since(sent).Round(time.Millisecond), d.ErrorCode, api.Code(d.ErrorCode).Name(), d.Error)
		holderCountsNoPull(t, pe, hold)
		return
	}
}

// startPullOnHolder has engine de pull every block of hold (pull id
// pullID) and waits until the holder counts the pull: it is reading. The
// pull.done notices of de come back on the result.
func startPullOnHolder(t *testing.T, nc *nats.Conn, pe, de *engine, hold *messages.CreateHoldReply, ids []uint32, pullID string) *notices[*messages.PullDone] {
	t.Helper()
	done := subscribe(t, nc, api.PullDoneSubject(de.cli.Member, de.id), func() *messages.PullDone { return new(messages.PullDone) })
	if _, err := de.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: hold.Params, EngineId: de.id, RegionId: de.rid, BlockIds: ids, PullId: pullID}); err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		st, err := pe.cli.Inspect(ctx5(t), &messages.HoldRef{TransferId: hold.Params.TransferId})
		if err != nil || st.ActivePulls == 0 {
			return fmt.Errorf("pull not active on the holder: %v %v", st, err)
		}
		return nil
	})
	return done
}

// holderCountsNoPull waits until the holder heard the pull's end (PullEnd):
// it stops counting it well before the pull's own deadline
// (pull_timeout_ms, 30 s).
func holderCountsNoPull(t *testing.T, pe *engine, hold *messages.CreateHoldReply) {
	t.Helper()
	checkFor(t, 10*time.Second, 5*time.Millisecond, func() error {
		st, err := pe.cli.Inspect(ctx5(t), &messages.HoldRef{TransferId: hold.Params.TransferId})
		if err != nil || st.ActivePulls != 0 {
			return fmt.Errorf("holder still counts the pull: %v %v", st, err)
		}
		return nil
	})
}
