package shim

import (
	"encoding/json"
	"fmt"
	"os"
	"testing"
)

// cursorAt is a (journal, seq) pair, written ["j1", 3] in the cases.
type cursorAt struct {
	Journal string
	Seq     uint64
}

func (p *cursorAt) UnmarshalJSON(b []byte) error {
	var a []json.RawMessage
	if err := json.Unmarshal(b, &a); err != nil {
		return err
	}
	if len(a) != 2 {
		return fmt.Errorf("a position is [journal, seq], not %s", b)
	}
	if err := json.Unmarshal(a[0], &p.Journal); err != nil {
		return err
	}
	return json.Unmarshal(a[1], &p.Seq)
}

func (p cursorAt) String() string { return fmt.Sprintf("(%q, %d)", p.Journal, p.Seq) }

// cursorStep is one call: exactly one of Live, Seen and Reset.
type cursorStep struct {
	Live     *cursorAt `json:"live"`
	Verdict  string    `json:"verdict"`
	Seen     *cursorAt `json:"seen"`
	OK       *bool     `json:"ok"`
	Reset    *cursorAt `json:"reset"`
	Position cursorAt  `json:"position"`
}

type cursorCase struct {
	Name  string       `json:"name"`
	Why   string       `json:"why"`
	Start cursorAt     `json:"start"`
	Steps []cursorStep `json:"steps"`
}

// TestNoticeCursorCases runs the cases the vLLM connector's NoticeCursor
// runs too (tests/test_notice_cursor_cases.py): both decide alike.
func TestNoticeCursorCases(t *testing.T) {
	data, err := os.ReadFile("testdata/notice_cursor_cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases []cursorCase
	if err := json.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) < 10 {
		t.Fatalf("%d cases, want at least 10", len(cases))
	}
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			var c noticeCursor
			c.Reset(tc.Start.Journal, tc.Start.Seq)
			for i, s := range tc.Steps {
				var call string
				switch {
				case s.Live != nil:
					call = "Live" + s.Live.String()
					if got := c.Live(s.Live.Journal, s.Live.Seq).String(); got != s.Verdict {
						t.Fatalf("step %d: %s = %s, want %s (%s)", i, call, got, s.Verdict, tc.Why)
					}
				case s.Seen != nil:
					call = "Seen" + s.Seen.String()
					if s.OK == nil {
						t.Fatalf("step %d: a seen step without ok", i)
					}
					if got := c.Seen(s.Seen.Journal, s.Seen.Seq); got != *s.OK {
						t.Fatalf("step %d: %s = %v, want %v (%s)", i, call, got, *s.OK, tc.Why)
					}
				case s.Reset != nil:
					call = "Reset" + s.Reset.String()
					c.Reset(s.Reset.Journal, s.Reset.Seq)
				default:
					t.Fatalf("step %d: none of live, seen, reset", i)
				}
				if j, q := c.Position(); j != s.Position.Journal || q != s.Position.Seq {
					t.Fatalf("step %d: after %s the position is (%q, %d), want %s (%s)", i, call, j, q, s.Position, tc.Why)
				}
			}
		})
	}
}

// TestNoticeCursorBehind: an engine.register reply's newest (journal, seq)
// asks for a fetch only when notices are missing; a new, empty journal is
// adopted at once.
func TestNoticeCursorBehind(t *testing.T) {
	for _, tc := range []struct {
		name   string
		start  cursorAt
		reply  cursorAt
		behind bool
		after  cursorAt
	}{
		{"no journal in the reply", cursorAt{"j1", 3}, cursorAt{"", 9}, false, cursorAt{"j1", 3}},
		{"up to date", cursorAt{"j1", 3}, cursorAt{"j1", 3}, false, cursorAt{"j1", 3}},
		{"ahead of the reply", cursorAt{"j1", 5}, cursorAt{"j1", 3}, false, cursorAt{"j1", 5}},
		{"notices missed", cursorAt{"j1", 3}, cursorAt{"j1", 4}, true, cursorAt{"j1", 3}},
		{"a new journal, empty", cursorAt{"j1", 3}, cursorAt{"j2", 0}, false, cursorAt{"j2", 0}},
		{"a new journal with notices", cursorAt{"j1", 3}, cursorAt{"j2", 1}, true, cursorAt{"j1", 3}},
		{"no position yet", cursorAt{"", 0}, cursorAt{"j1", 2}, true, cursorAt{"", 0}},
	} {
		c := noticeCursor{journal: tc.start.Journal, seq: tc.start.Seq}
		if got := c.Behind(tc.reply.Journal, tc.reply.Seq); got != tc.behind {
			t.Errorf("%s: Behind%s from %s = %v, want %v", tc.name, tc.reply, tc.start, got, tc.behind)
		}
		if j, q := c.Position(); j != tc.after.Journal || q != tc.after.Seq {
			t.Errorf("%s: position after (%q, %d), want %s", tc.name, j, q, tc.after)
		}
	}
}
