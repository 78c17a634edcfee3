package localcluster

import "testing"

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Target
	}{
		{"router", Target{RouterName, PartConnexd}},
		{"router/connexd", Target{RouterName, PartConnexd}},
		{"prefill-0", Target{"prefill-0", PartBoth}},
		{"decode-1", Target{"decode-1", PartBoth}},
		{"decode-1/engine", Target{"decode-1", PartEngine}},
		{"decode-12/connexd", Target{"decode-12", PartConnexd}},
	} {
		got, err := ParseTarget(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseTarget(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", "router/engine", "decode", "decode-", "decode-x", "decode-01", "decode--1",
		"encode-1", "decode-1/", "decode-1/sim", "decode-1/engine/x", "Router"} {
		if got, err := ParseTarget(bad); err == nil {
			t.Errorf("ParseTarget(%q) = %+v, want an error", bad, got)
		}
	}
}

func TestTargetString(t *testing.T) {
	for _, s := range []string{"router/connexd", "decode-1", "decode-1/engine", "prefill-0/connexd"} {
		tg, err := ParseTarget(s)
		if err != nil {
			t.Fatal(err)
		}
		if tg.String() != s {
			t.Errorf("ParseTarget(%q).String() = %q", s, tg.String())
		}
	}
}

func TestNames(t *testing.T) {
	if got := engineName(RoleDecode, 1); got != "decode-1" {
		t.Errorf("engineName = %q", got)
	}
	if got := processName("decode-1", PartEngine); got != "decode-1/engine" {
		t.Errorf("processName = %q", got)
	}
	if got := processName(RouterName, PartConnexd); got != "router" {
		t.Errorf("processName(router) = %q", got)
	}
}
