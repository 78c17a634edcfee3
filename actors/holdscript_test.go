package actors

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/connex/connex/clock"
	"github.com/connex/connex/errcode"
	"github.com/connex/connex/lease"
	"github.com/connex/connex/messages"
)

var rewrite = flag.Bool("rewrite", false, "rewrite expected output in testdata/hold/*.txt")

// TestHoldScripts runs the scripts in testdata/hold/ against a real hold
// actor (under a HoldTable, in a real actor system) on a clock.Fake, with
// an in-memory backend and region. Each case is a command, a line "----",
// the expected output and a blank line; comment lines (#) before a command
// are kept. Commands:
//
//	create blocks=1,2,5 retain=60s [mode=after_pull] [owner=e] [consumer=d]
//	start-read id=a by=d timeout=10s [panic]   (panic: the actor panics answering it)
//	end-read id=a by=d ok=true|false
//	renew [by=d] · release [by=e] · inspect · engine-gone · shutdown
//	advance 10s     (fires the due timers, then waits until the actor handled them)
//	wait-stopped    (polls until the actor has stopped: its region reference is back)
//
// After each command the output has the answer, the BlocksFreed notices
// sent since the last command, and a line of what the test can see: block
// accounting (held, reading), live registrations, the directory's view of
// the transfer, holds freed and pending fake timers. Run with -rewrite to
// regenerate the expected outputs after a deliberate change.
func TestHoldScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/hold/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runHoldScript(t, f) })
	}
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

type holdCase struct{ comment, cmd, want string }

func runHoldScript(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var cases []holdCase
	var header, comment []string
	var cur *holdCase
	inOut := false
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur == nil && (strings.HasPrefix(line, "#") || strings.TrimSpace(line) == ""):
			if len(cases) == 0 {
				header = append(header, line)
			} else if strings.HasPrefix(line, "#") {
				comment = append(comment, line+"\n")
			}
		case cur == nil:
			cases = append(cases, holdCase{comment: strings.Join(comment, ""), cmd: line})
			cur, comment = &cases[len(cases)-1], nil
		case !inOut && line == "----":
			inOut = true
		case inOut && line == "":
			cur, inOut = nil, false
		case inOut:
			cur.want += line + "\n"
		default:
			t.Fatalf("%s: expected ---- after %q, got %q", path, cur.cmd, line)
		}
	}
	s := &holdScript{t: t, t0: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	s.clk = clock.NewFake(s.t0)
	s.rig = newHoldRigClock(t, s.clk)
	var out strings.Builder
	if len(header) > 0 {
		out.WriteString(strings.Join(header, "\n") + "\n")
	}
	for _, c := range cases {
		got := s.run(c.cmd)
		if !*rewrite && got != c.want {
			t.Errorf("%s\n%s\n----\ngot:\n%swant:\n%s", path, c.cmd, got, c.want)
		}
		fmt.Fprintf(&out, "%s%s\n----\n%s\n", c.comment, c.cmd, got)
		if n := s.rig.metrics.DoubleFrees.Load(); n != 0 {
			t.Fatalf("%s: after %q: %d double frees", path, c.cmd, n)
		}
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func (s *holdScript) run(line string) string {
	t := s.t
	fields := strings.Fields(line)
	args := map[string]string{}
	var pos []string
	for _, f := range fields[1:] {
		if k, v, ok := strings.Cut(f, "="); ok {
			args[k] = v
		} else {
			pos = append(pos, f)
		}
	}
	dur := func(v string) time.Duration {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		return d
	}
	var b strings.Builder
	switch fields[0] {
	case "create":
		s.create(&b, line, args, dur(args["retain"]))
	case "start-read":
		m := &StartRead{By: args["by"], PullID: args["id"], Timeout: dur(args["timeout"]), Layout: s.rig.region.Region.Layout}
		if len(pos) == 1 && pos[0] == "panic" {
			s.rig.panicNext.Store(true)
			s.rig.sys.Root.Send(s.pid, m)
			s.waitStopped()
			b.WriteString("stopped\n")
			break
		}
		s.ask(&b, m)
	case "end-read":
		s.ask(&b, &EndRead{PullID: args["id"], By: args["by"], OK: args["ok"] == "true"})
	case "renew":
		s.ask(&b, &RenewHold{By: args["by"]})
	case "release":
		s.ask(&b, &ReleaseHold{By: args["by"]})
	case "inspect":
		s.ask(&b, &InspectHold{})
	case "engine-gone":
		s.ask(&b, &EngineGone{})
	case "shutdown":
		s.ask(&b, &Shutdown{})
	case "advance":
		s.clk.Advance(dur(pos[0]))
		s.settle()
		fmt.Fprintf(&b, "t=%s\n", s.clk.Now().Sub(s.t0))
	case "wait-stopped":
		s.waitStopped()
		b.WriteString("stopped\n")
	default:
		t.Fatalf("unknown command %q", line)
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

func (s *holdScript) create(b *strings.Builder, line string, args map[string]string, retain time.Duration) {
	var blocks []uint32
	for _, v := range strings.Split(args["blocks"], ",") {
		n, err := strconv.ParseUint(v, 10, 32)
		if err != nil {
			s.t.Fatalf("%q: blocks: %v", line, err)
		}
		blocks = append(blocks, uint32(n))
	}
	mode := lease.OnFinish
	if m, ok := args["mode"]; ok {
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
		Lease: lease.Config{Retain: retain, Mode: mode, Owner: args["owner"], Consumer: args["consumer"]},
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
