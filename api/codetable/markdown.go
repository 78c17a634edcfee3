package codetable

import (
	"fmt"
	"strings"
)

// The markers around docs/api.md's generated tables.
const (
	Begin     = "<!-- error codes: generated from api/codes.json by `go generate ./api`; do not edit -->"
	End       = "<!-- end of error codes -->"
	BeginHTTP = "<!-- router error codes: generated from api/codes.json by `go generate ./api`; do not edit -->"
	EndHTTP   = "<!-- end of router error codes -->"
)

// Markdown renders the NATS table and how the shims name load failures,
// between Begin and End.
func Markdown(t Table) string {
	var b strings.Builder
	b.WriteString(Begin + "\n\n| code | name | meaning |\n| --- | --- | --- |\n")
	for _, e := range t.NATS {
		fmt.Fprintf(&b, "| %d | %s | %s |\n", e.Code, e.Name, e.Meaning)
	}
	b.WriteString("\nA failed KV load reads as its code's name (`KV load of transfer … failed: expired`), in the Go shim\n" +
		"(`shim.Reason`) and the vLLM connector (`connex_vllm.codes.reason`) alike, except:")
	sep := " "
	for _, e := range t.NATS {
		if e.Reason != "" {
			fmt.Fprintf(&b, "%s%s reads `%s`", sep, e.Name, e.Reason)
			sep = ", "
		}
	}
	b.WriteString(".\n\n" + End)
	return b.String()
}

// MarkdownHTTP renders the router's table, between BeginHTTP and EndHTTP.
func MarkdownHTTP(t Table) string {
	var b strings.Builder
	b.WriteString(BeginHTTP + "\n\n| code | status | meaning |\n| --- | --- | --- |\n")
	for _, e := range t.HTTP {
		m := e.Meaning
		if n, ok := t.mirrored(e); ok {
			m += fmt.Sprintf(" (the NATS API's %d `%s`)", n.Code, n.Name)
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", e.Code, e.Status, m)
	}
	b.WriteString("\n" + EndHTTP)
	return b.String()
}

// Splice replaces the block of readme between begin and end (markers
// included) with block, which carries its own markers.
func Splice(readme, begin, end, block string) (string, error) {
	i, j := strings.Index(readme, begin), strings.Index(readme, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("docs/api.md has no %q ... %q block", begin, end)
	}
	return readme[:i] + block + readme[j+len(end):], nil
}
