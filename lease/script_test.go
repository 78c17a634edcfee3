package lease

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var rewrite = flag.Bool("rewrite", false, "rewrite expected output in testdata/*.txt")

// TestScripts runs the interaction scripts in testdata/. Each case is a
// command, a line "----", the expected output and a blank line. Commands:
//
//	new retain=60s [mode=after_pull] [owner=p] [consumer=d]
//	advance 10s             (moves the clock and delivers a Tick)
//	renew [by=d]
//	pull-start id=a [by=d] timeout=5s
//	pull-end id=a [by=d] ok=true|false
//	release [by=d]
//	engine-gone
//	shutdown
//	abort
//	rebind consumer=d2 epoch=1
//
// Run with -rewrite to regenerate the expected outputs after a deliberate change.
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) { runScript(t, f) })
	}
}

type scriptCase struct {
	// comment is the comment lines just above the command (kept by
	// -rewrite).
	comment   string
	cmd, want string
}

func parseScript(t *testing.T, path string) (header string, cases []scriptCase) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	var hdr, comment []string
	var cur *scriptCase
	inOut := false
	for sc.Scan() {
		line := sc.Text()
		switch {
		case cur == nil && (strings.HasPrefix(line, "#") || strings.TrimSpace(line) == ""):
			if len(cases) == 0 {
				hdr = append(hdr, line)
			} else if strings.HasPrefix(line, "#") {
				comment = append(comment, line)
			}
		case cur == nil:
			cases = append(cases, scriptCase{cmd: line})
			cur = &cases[len(cases)-1]
			if len(comment) > 0 {
				cur.comment = strings.Join(comment, "\n") + "\n"
				comment = nil
			}
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
	return strings.Join(hdr, "\n"), cases
}

func runScript(t *testing.T, path string) {
	header, cases := parseScript(t, path)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := t0
	var h *Hold
	var out strings.Builder
	if header != "" {
		out.WriteString(header + "\n")
	}
	for _, c := range cases {
		got := runCommand(t, c.cmd, &h, &now, t0)
		if !*rewrite && got != c.want {
			t.Errorf("%s\n%s\n----\ngot:\n%swant:\n%s", path, c.cmd, got, c.want)
		}
		fmt.Fprintf(&out, "%s%s\n----\n%s\n", c.comment, c.cmd, got)
	}
	if *rewrite {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func runCommand(t *testing.T, line string, h **Hold, now *time.Time, t0 time.Time) string {
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
	dur := func(s string) time.Duration {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		return d
	}
	var fx []Effect
	var err error
	switch fields[0] {
	case "new":
		mode := OnFinish
		if m, ok := args["mode"]; ok {
			if mode, err = ParseMode(m); err != nil {
				t.Fatal(err)
			}
		}
		*h, err = New(*now, Config{Retain: dur(args["retain"]), Mode: mode, Owner: args["owner"], Consumer: args["consumer"]})
		if err != nil {
			return fmt.Sprintf("error: %v\n", err)
		}
	case "advance":
		*now = now.Add(dur(pos[0]))
		fx, err = (*h).Step(Tick{Now: *now})
	case "renew":
		fx, err = (*h).Step(Renew{Now: *now, By: args["by"]})
	case "pull-start":
		fx, err = (*h).Step(PullStart{Now: *now, By: args["by"], PullID: args["id"], Deadline: now.Add(dur(args["timeout"]))})
	case "pull-end":
		fx, err = (*h).Step(PullEnd{Now: *now, By: args["by"], PullID: args["id"], OK: args["ok"] == "true"})
	case "release":
		fx, err = (*h).Step(Release{Now: *now, By: args["by"]})
	case "engine-gone":
		fx, err = (*h).Step(EngineGoneEvent{Now: *now})
	case "shutdown":
		fx, err = (*h).Step(Shutdown{Now: *now})
	case "abort":
		fx, err = (*h).Step(Abort{Now: *now})
	case "rebind":
		var epoch uint64
		if _, err := fmt.Sscan(args["epoch"], &epoch); err != nil {
			t.Fatalf("%q: epoch: %v", line, err)
		}
		fx, err = (*h).Step(Rebind{Now: *now, Consumer: args["consumer"], Epoch: epoch})
	default:
		t.Fatalf("unknown command %q", line)
	}
	var b strings.Builder
	for _, e := range fx {
		switch e := e.(type) {
		case Deregister:
			b.WriteString("effect: deregister\n")
		case Free:
			fmt.Fprintf(&b, "effect: free reason=%s notify=%v\n", e.Reason, e.Notify)
		case PullAbandoned:
			fmt.Fprintf(&b, "effect: pull-abandoned id=%s\n", e.PullID)
		case BeginRead:
			fmt.Fprintf(&b, "effect: begin-read id=%s\n", e.PullID)
		case EndRead:
			fmt.Fprintf(&b, "effect: end-read id=%s\n", e.PullID)
		default:
			t.Fatalf("%q: unknown effect %T", line, e)
		}
	}
	if err != nil {
		fmt.Fprintf(&b, "error: %v\n", err)
	}
	st := (*h).Status()
	fmt.Fprintf(&b, "t=%s state=%s pulls=%d done=%d freed=%v", now.Sub(t0), st.State, st.ActivePulls, st.PullsDone, st.Freed)
	if at, ok := (*h).NextWake(); ok {
		fmt.Fprintf(&b, " wake=%s", at.Sub(t0))
	}
	b.WriteString("\n")
	return b.String()
}
