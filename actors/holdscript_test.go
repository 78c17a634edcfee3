package actors

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/cockroachdb/datadriven"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/errcode"
	"github.com/connex/connex/lease"
	"github.com/connex/connex/messages"
)

// TestHoldScripts runs the scripts in testdata/hold/ with datadriven
// against a real hold actor (under a HoldSupervisor, in a real actor system) on
// a clock.Fake, with an in-memory backend and region; each file has its own
// rig and clock. Each case is a command, a line "----", the expected output
// and a blank line; lines starting with # are comments. Commands:
//
//	create blocks=1,2,5 retain=60s [mode=after_pull] [owner=e] [consumer=d]
//	start-read id=a by=d timeout=10s [request=q] [panic]
//	    (request: start only if bound to d for request q, else "unbound";
//	    panic: the actor panics answering it)
//	rebind consumer=d request=q epoch=1
//	end-read id=a by=d ok=true|false
//	renew [by=d] · release [by=e] · inspect · engine-gone · shutdown
//	advance 10s     (fires the due timers, then waits until the actor handled them)
//	wait-stopped    (polls until the actor has stopped: its region reference is back)
//
// After each command the output has the answer, the BlocksFreed notices
// sent since the last command, and a line of what the test can see: block
// accounting (held, reading), live registrations, the directory's view of
// the transfer, holds freed and pending fake timers. Run with -rewrite
// (datadriven's flag) to regenerate the expected outputs after a deliberate
// change.
func TestHoldScripts(t *testing.T) {
	datadriven.Walk(t, "testdata/hold", func(t *testing.T, path string) {
		s := &holdScript{t: t, t0: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
		s.clk = clock.NewFake(s.t0)
		s.rig = newHoldRigClock(t, s.clk)
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			got := s.run(d)
			if n := s.rig.metrics.DoubleFrees.Load(); n != 0 {
				d.Fatalf(t, "after %q: %d double frees", d.Cmd, n)
			}
			return got
		})
	})
}

// askTimeout bounds the wait for one answer of the actor; it is no claim
// about speed (an answer normally takes microseconds).
const askTimeout = 10 * time.Second

type holdScript struct {
	t    *testing.T
	rig  *holdRig
	clk  *clock.Fake
	t0   time.Time
	id   string
	pid  *actor.PID
	seen int // notices already shown
}

// str is the value of d's optional argument key, or "".
func (s *holdScript) str(d *datadriven.TestData, key string) string {
	var v string
	d.MaybeScanArgs(s.t, key, &v)
	return v
}

// run runs one script command and returns what it shows.
func (s *holdScript) run(d *datadriven.TestData) string {
	t := s.t
	line := d.FullCmd()
	dur := func(key string) time.Duration {
		var v time.Duration
		d.ScanArgs(t, key, &v)
		return v
	}
	if s.pid == nil && d.Cmd != "create" {
		d.Fatalf(t, "%s before create", d.Cmd)
	}
	var b strings.Builder
	switch d.Cmd {
	case "create":
		s.create(&b, d, dur("retain"))
	case "start-read":
		m := &StartRead{By: s.str(d, "by"), PullID: s.str(d, "id"), Timeout: dur("timeout"), Layout: s.rig.region.Region.Layout, Request: s.str(d, "request")}
		if d.HasArg("panic") {
			s.rig.panicNext.Store(true)
			s.rig.sys.Root.Send(s.pid, m)
			s.waitStopped()
			b.WriteString("stopped\n")
			break
		}
		s.ask(&b, m)
	case "end-read":
		var ok bool
		d.ScanArgs(t, "ok", &ok)
		s.ask(&b, &EndRead{PullID: s.str(d, "id"), By: s.str(d, "by"), OK: ok})
	case "rebind":
		var epoch uint64
		d.ScanArgs(t, "epoch", &epoch)
		s.ask(&b, &RebindHold{Consumer: s.str(d, "consumer"), Request: s.str(d, "request"), Epoch: epoch})
	case "renew":
		s.ask(&b, &RenewHold{By: s.str(d, "by")})
	case "release":
		s.ask(&b, &ReleaseHold{By: s.str(d, "by")})
	case "inspect":
		s.ask(&b, &InspectHold{})
	case "engine-gone":
		s.ask(&b, &EngineGone{})
	case "shutdown":
		s.ask(&b, &Shutdown{})
	case "advance":
		s.clk.Advance(advanceBy(t, d))
		s.settle()
		fmt.Fprintf(&b, "t=%s\n", s.clk.Now().Sub(s.t0))
	case "wait-stopped":
		s.waitStopped()
		b.WriteString("stopped\n")
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	s.rig.mu.Lock()
	for _, n := range s.rig.notices[s.seen:] {
		if n.TransferId != s.id || n.EngineId != "e" || n.RegionId != "r" {
			t.Errorf("%q: notice for %s/%s/%s, want this transfer's", line, n.TransferId, n.EngineId, n.RegionId)
		}
		fmt.Fprintf(&b, "notice blocks-freed reason=%s blocks=%v\n", n.Reason, n.BlockIds)
	}
	s.seen = len(s.rig.notices)
	s.rig.mu.Unlock()
	c := s.rig.region.Blocks.Counts()
	dir := "unknown"
	if e, st, ended := s.rig.dir.Lookup(s.id); e != nil {
		dir = "live:" + lease.State(e.State.Load()).String()
	} else if ended {
		dir = "ended:" + st.String()
	}
	fmt.Fprintf(&b, "held=%d reading=%d regs=%d dir=%s freed=%d timers=%d\n",
		c.Held, c.Reading, s.rig.be.live.Load(), dir, s.rig.metrics.HoldsFreed.Load(), s.clk.Pending())
	return b.String()
}

// create asks the table for a hold as d says and shows the answer; the
// blocks are a comma-separated list (blocks=1,2,5).
func (s *holdScript) create(b *strings.Builder, d *datadriven.TestData, retain time.Duration) {
	line := d.FullCmd()
	var list string
	d.ScanArgs(s.t, "blocks", &list)
	var blocks []uint32
	for _, v := range strings.Split(list, ",") {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			d.Fatalf(s.t, "blocks: %v", err)
		}
		blocks = append(blocks, uint32(n))
	}
	mode := lease.OnFinish
	if m := s.str(d, "mode"); m != "" {
		var err error
		if mode, err = lease.ParseMode(m); err != nil {
			s.t.Fatal(err)
		}
	}
	s.id = NewTransferID()
	s.rig.regRefs.Add(1)
	res, err := s.rig.sys.Root.RequestFuture(s.rig.table, &CreateHold{
		ID: s.id, Req: &messages.CreateHoldRequest{EngineId: "e", RegionId: "r", BlockIds: blocks},
		Region: s.rig.region, ReleaseRegion: func() { s.rig.regRefs.Add(-1) },
		Lease: lease.Config{Retain: retain, Mode: mode, Owner: s.str(d, "owner"), Consumer: s.str(d, "consumer")},
	}, askTimeout).Result()
	if err != nil {
		s.t.Fatalf("%q: %v", line, err)
	}
	rep := res.(Reply)
	if rep.Err != nil {
		fmt.Fprintf(b, "error code=%s\n", errcode.AsError(rep.Err).Code.Name())
		return
	}
	e, _, _ := s.rig.dir.Lookup(s.id)
	if e == nil {
		s.t.Fatalf("%q: the created hold is not in the directory", line)
	}
	s.pid = e.PID
	fmt.Fprintf(b, "created blocks=%v expires=%s\n", rep.Create.Params.RemoteBlockIds, s.rel(rep.Create.ExpiresUnixMs))
}

// ask sends m to the hold actor and shows its answer.
func (s *holdScript) ask(b *strings.Builder, m any) {
	res, err := s.rig.sys.Root.RequestFuture(s.pid, m, askTimeout).Result()
	switch {
	case errors.Is(err, actor.ErrDeadLetter):
		b.WriteString("no answer: the actor has stopped\n")
		return
	case err != nil:
		s.t.Fatalf("ask %T: %v", m, err)
	}
	rep := res.(Reply)
	switch {
	case rep.Unbound:
		b.WriteString("unbound\n")
	case rep.Err != nil:
		fmt.Fprintf(b, "error code=%s\n", errcode.AsError(rep.Err).Code.Name())
	case rep.Desc != nil:
		d := rep.Desc
		fmt.Fprintf(b, "descriptors blocks=%v rkeys=%d pull_end_async=%v expires=%s\n", d.BlockIds, len(d.Rkeys), d.PullEndAsync, s.rel(d.ExpiresUnixMs))
	case rep.Status != nil:
		st := rep.Status
		fmt.Fprintf(b, "status state=%s pulls=%d done=%d freed=%v expires=%s\n", st.State, st.ActivePulls, st.PullsDone, st.Freed, s.rel(st.ExpiresUnixMs))
	default:
		s.t.Fatalf("ask %T: empty reply", m)
	}
}

// rel shows a wall-clock reading in ms as an offset from the script's start.
func (s *holdScript) rel(ms int64) string {
	return time.UnixMilli(ms).Sub(s.t0).String()
}

// settle returns once the actor has handled what the timers that fell due
// in an Advance sent it: they are in its mailbox, so an answer to a message
// sent after them means it has; a stop (the linger elapsed) drops that
// message unanswered, so the actor's having stopped means it too.
func (s *holdScript) settle() {
	answered := make(chan struct{})
	go func() {
		_, _ = s.rig.sys.Root.RequestFuture(s.pid, &InspectHold{}, askTimeout).Result()
		close(answered)
	}()
	poll(s.t, "hold actor handled its timers", func() error {
		select {
		case <-answered:
			return nil
		default:
		}
		if s.rig.regRefs.Load() == 0 {
			return nil
		}
		return errors.New("no answer yet, and the actor has not stopped")
	})
}

// waitStopped polls until the actor has stopped: Stopped gives its region
// reference back, after Stopping gave back everything else.
func (s *holdScript) waitStopped() {
	poll(s.t, "hold actor stopped", func() error {
		if n := s.rig.regRefs.Load(); n != 0 {
			return fmt.Errorf("%d region references held", n)
		}
		return nil
	})
}

// advanceBy is the duration of "advance 10s": its one argument, a key
// without a value.
func advanceBy(t *testing.T, d *datadriven.TestData) time.Duration {
	if len(d.CmdArgs) != 1 || len(d.CmdArgs[0].Vals) != 0 {
		d.Fatalf(t, "advance takes one duration, as in \"advance 10s\"")
	}
	v, err := time.ParseDuration(d.CmdArgs[0].Key)
	if err != nil {
		d.Fatalf(t, "advance: %v", err)
	}
	return v
}
