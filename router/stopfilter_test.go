package router

import (
	"encoding/json"
	"strings"
	"testing"
)

// feedAll runs chunks through f (the last one final) and returns what was
// emitted and whether a stop string matched.
func feedAll(f *stopFilter, chunks ...string) (string, bool) {
	var out strings.Builder
	for i, c := range chunks {
		e, m := f.feed(c, i == len(chunks)-1)
		out.WriteString(e)
		if m {
			return out.String(), true
		}
	}
	return out.String(), false
}

func TestStopFilter(t *testing.T) {
	cases := []struct {
		name              string
		stops             []string
		include           bool
		relayed, withheld string
		chunks            []string
		want              string
		wantMatch         bool
	}{
		// The dead engine held back "e 1"; no stop matches: everything owed
		// is emitted, in order, by the end.
		{"withheld released", []string{"e 118@@"}, false, "cach", "e 1", []string{"186", " 13", "4"}, "e 1186 134", false},
		// A stop string across the boundary: begins in the held-back text,
		// ends in the new engine's text.
		{"match across resume", []string{"END!"}, false, "abc", " EN", []string{"D! more", "x"}, " ", true},
		{"match includes stop", []string{"END!"}, true, "abc", " EN", []string{"D! more"}, " END!", true},
		// A match starting in text already relayed cuts at the boundary.
		{"match from relayed tail", []string{"xyz"}, false, "..xy", "", []string{"z tail"}, "", true},
		// Earliest of several stops wins.
		{"earliest stop", []string{"bb", "a"}, false, "", "", []string{"xxbba"}, "xx", true},
		// Held back until final: the last keep bytes go out only at the end.
		{"hold back", []string{"abc"}, false, "", "", []string{"hello", "", "x"}, "hellox", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, m := feedAll(newStopFilter(tc.stops, tc.include, tc.relayed, tc.withheld), tc.chunks...)
			if got != tc.want || m != tc.wantMatch {
				t.Fatalf("emitted %q matched %v, want %q %v", got, m, tc.want, tc.wantMatch)
			}
		})
	}
}

// TestStopFilterHoldsBack: before the end, the last len(stop)-1 bytes are
// never emitted (they may begin a stop string), and a multi-byte character
// is never split between chunks.
func TestStopFilterHoldsBack(t *testing.T) {
	f := newStopFilter([]string{"wxyz"}, false, "", "")
	if e, _ := f.feed("abcdef", false); e != "abc" {
		t.Fatalf("emitted %q, want %q (3 bytes held back)", e, "abc")
	}
	f = newStopFilter([]string{"ab"}, false, "", "")
	if e, _ := f.feed("x\u00e9", false); e != "x" {
		t.Fatalf("emitted %q: a split character", e)
	}
	if e, _ := f.feed("", true); e != "\u00e9" {
		t.Fatalf("final emitted %q", e)
	}
}

func TestStopStrings(t *testing.T) {
	for _, tc := range []struct {
		body string
		want []string
		inc  bool
	}{
		{`{"stop":"a"}`, []string{"a"}, false},
		{`{"stop":["a","bc"],"include_stop_str_in_output":true}`, []string{"a", "bc"}, true},
		{`{"stop":null}`, nil, false},
		{`{"stop":7}`, nil, false},
		{`{}`, nil, false},
	} {
		var b map[string]json.RawMessage
		if err := json.Unmarshal([]byte(tc.body), &b); err != nil {
			t.Fatal(err)
		}
		got, inc := stopStrings(b)
		if strings.Join(got, "|") != strings.Join(tc.want, "|") || inc != tc.inc {
			t.Errorf("%s: got %q %v", tc.body, got, inc)
		}
	}
}
