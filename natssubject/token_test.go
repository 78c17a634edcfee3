package natssubject

import (
	"strings"
	"testing"
)

func TestValidToken(t *testing.T) {
	for s, want := range map[string]bool{
		"decode-0": true, "vllm_d0": true, "é": true, strings.Repeat("x", MaxTokenLen): true,
		"": false, "a.b": false, "*": false, "x>": false, "tab\t": false, "sp ace": false, "\x7f": false,
		"\xff": false, "\u00a0": false, strings.Repeat("x", MaxTokenLen+1): false,
	} {
		if got := ValidToken(s); got != want {
			t.Errorf("ValidToken(%q) = %v, want %v", s, got, want)
		}
	}
}

func FuzzValidToken(f *testing.F) {
	f.Add("decode-0")
	f.Add("a.b")
	f.Fuzz(func(t *testing.T, s string) {
		if !ValidToken(s) {
			return
		}
		// An accepted token never splits or widens a subject.
		if strings.ContainsAny(s, ".*> \t\r\n") || len(s) > MaxTokenLen {
			t.Fatalf("accepted %q", s)
		}
	})
}
