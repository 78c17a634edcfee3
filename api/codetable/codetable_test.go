package codetable

import (
	"strings"
	"testing"
)

// table wraps NATS and HTTP entries (JSON objects) into a codes.json.
func table(nats, http string) string { return `{"nats": [` + nats + `], "http": [` + http + `]}` }

const (
	okNATS = `{"code": 502, "name": "b", "const": "CodeB", "meaning": "the ` + "`b`" + ` one", "reason": "bee gone"}, {"code": 400, "name": "a", "const": "CodeA", "meaning": "a"}`
	okHTTP = `{"code": "x_failed", "const": "CodeX", "status": "503", "meaning": "x"}`
)

func TestParseRefusesABadTable(t *testing.T) {
	for _, c := range []struct{ json, want string }{
		{table(`{"code": 399, "name": "x", "const": "CodeX", "meaning": "m"}`, okHTTP), "400..599"},
		{table(`{"code": 400, "name": "X", "const": "CodeX", "meaning": "m"}`, okHTTP), "lower_snake_case"},
		{table(`{"code": 400, "name": "x", "const": "X", "meaning": "m"}`, okHTTP), "CodeSomething"},
		{table(`{"code": 400, "name": "x", "const": "CodeX", "meaning": ""}`, okHTTP), "meaning"},
		{table(`{"code": 400, "name": "x", "const": "CodeX", "meaning": "m"}, {"code": 400, "name": "y", "const": "CodeY", "meaning": "m"}`, okHTTP), "twice"},
		{table(`{"code": 400, "name": "x", "const": "CodeX", "meaning": "m", "extra": 1}`, okHTTP), "unknown field"},
		{table(`{"code": 400, "name": "x", "const": "CodeX", "meaning": "m", "reason": "Say \"x\""}`, okHTTP), "lower-case words"},
		{table(`{"code": 400, "name": "x", "const": "CodeX", "meaning": "m", "reason": "x"}`, okHTTP), "other than the name"},
		{table(okNATS, ""), "both"},
		{table(okNATS, `{"code": "X", "const": "CodeX", "status": "400", "meaning": "m"}`), "lower_snake_case"},
		{table(okNATS, `{"code": "x", "const": "CodeX", "status": "", "meaning": "m"}`), "one non-empty line"},
		{table(okNATS, okHTTP+`, {"code": "y", "const": "CodeX", "status": "400", "meaning": "m"}`), "twice"},
		// A mirror must be spelled as the NATS code it mirrors, and a code
		// spelled like a NATS code must say it mirrors it.
		{table(okNATS, `{"code": "x", "const": "CodeX", "status": "400", "meaning": "m", "nats": 400}`), `whose name is "a"`},
		{table(okNATS, `{"code": "a", "const": "CodeX", "status": "400", "meaning": "m"}`), "spelled like a NATS code"},
	} {
		if _, err := Parse([]byte(c.json)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%s) = %v, want an error about %s", c.json, err, c.want)
		}
	}
}

func TestRenderingsCarryTheTable(t *testing.T) {
	tb, err := Parse([]byte(table(okNATS, okHTTP+`, {"code": "a", "const": "CodeA", "status": "429", "meaning": "m", "nats": 400}`)))
	if err != nil || tb.NATS[0].Code != 400 {
		t.Fatalf("Parse sorts by code: %v %v", tb, err)
	}
	files, err := Files(tb)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		"api/codes_gen.go":                           {"CodeB Code = 502 // the b one", `CodeA: "a"`},
		"router/codes_gen.go":                        {`CodeX = "x_failed" // 503: x`, "mirrors NATS code 400 (a)", "routerCodes = []string{\n\tCodeX,\n\tCodeA,\n}"},
		"engine/shim/reasons_gen.go":                 {"loadReasons = map[api.Code]string{\n\tapi.CodeB: \"bee gone\",\n}"},
		"engine/vllm-connector/connex_vllm/codes.py": {"# the b one\nCODE_B: Final = 502\n", `    CODE_A: "a",`, `_REASONS: Final[Mapping[int, str]] = {` + "\n" + `    CODE_B: "bee gone",` + "\n}"},
	}
	for _, f := range files {
		for _, w := range want[f.Path] {
			if !strings.Contains(string(f.Data), w) {
				t.Errorf("%s lacks %q:\n%s", f.Path, w, f.Data)
			}
		}
		delete(want, f.Path)
	}
	if len(want) != 0 {
		t.Errorf("not generated: %v", want)
	}
	readme, err := Doc("intro\n"+Begin+"\nold\n"+End+"\nmiddle\n"+BeginHTTP+"\n"+EndHTTP+"\nend\n", tb)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"intro\n", "| 502 | b | the `b` one |", "b reads `bee gone`", "\nmiddle\n", "| x_failed | 503 | x |", "(the NATS API's 400 `a`)", "\nend\n"} {
		if !strings.Contains(readme, w) {
			t.Errorf("README lacks %q:\n%s", w, readme)
		}
	}
	if strings.Contains(readme, "old") {
		t.Errorf("README kept the old table:\n%s", readme)
	}
	if _, err := Doc("no markers", tb); err == nil {
		t.Fatal("README without markers: want an error")
	}
}

func TestWrapKeepsWordsAndWidth(t *testing.T) {
	got := wrap("aa bb cc dddddd e", 5)
	if strings.Join(got, "|") != "aa bb|cc|dddddd|e" {
		t.Fatalf("wrap: %q", got)
	}
}
