package codetable

import (
	"strings"
	"testing"
)

func TestParseRefusesABadTable(t *testing.T) {
	for _, c := range []struct{ json, want string }{
		{`[{"code": 399, "name": "x", "const": "CodeX", "meaning": "m"}]`, "400..599"},
		{`[{"code": 400, "name": "X", "const": "CodeX", "meaning": "m"}]`, "lower_snake_case"},
		{`[{"code": 400, "name": "x", "const": "X", "meaning": "m"}]`, "CodeSomething"},
		{`[{"code": 400, "name": "x", "const": "CodeX", "meaning": ""}]`, "meaning"},
		{`[{"code": 400, "name": "x", "const": "CodeX", "meaning": "m"}, {"code": 400, "name": "y", "const": "CodeY", "meaning": "m"}]`, "twice"},
		{`[{"code": 400, "name": "x", "const": "CodeX", "meaning": "m", "extra": 1}]`, "unknown field"},
	} {
		if _, err := Parse([]byte(c.json)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%s) = %v, want an error about %s", c.json, err, c.want)
		}
	}
	es, err := Parse([]byte(`[{"code": 502, "name": "b", "const": "CodeB", "meaning": "the ` + "`b`" + ` one"}, {"code": 400, "name": "a", "const": "CodeA", "meaning": "a"}]`))
	if err != nil || es[0].Code != 400 {
		t.Fatalf("Parse sorts by code: %v %v", es, err)
	}
	src, err := Go(es)
	if err != nil || !strings.Contains(string(src), "CodeB Code = 502 // the b one") {
		t.Fatalf("Go: %s %v", src, err)
	}
	if _, err := Splice("no markers", Markdown(es)); err == nil {
		t.Fatal("Splice without markers: want an error")
	}
}
