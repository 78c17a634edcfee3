// Package codetable turns api/codes.json, the one source of the NATS API's
// error codes, into the Go constants and names of package api
// (codes_gen.go) and the table of README.md. It is pure: bytes in, bytes
// out; api/gencodes writes the files and a test in api checks them.
package codetable

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/format"
	"regexp"
	"slices"
	"strings"
)

// Entry is one error code.
type Entry struct {
	Code    int    `json:"code"`
	Name    string `json:"name"`
	Const   string `json:"const"`
	Meaning string `json:"meaning"` // Markdown, one line
}

// Begin and End mark the generated table in README.md.
const (
	Begin = "<!-- error codes: generated from api/codes.json by `go generate ./api`; do not edit -->"
	End   = "<!-- end of error codes -->"
)

var (
	nameRe  = regexp.MustCompile(`^[a-z][a-z_]*$`)
	constRe = regexp.MustCompile(`^Code[A-Z][A-Za-z]*$`)
)

// Parse reads and checks the table: codes, names and constants unique and
// well-formed, meanings present.
func Parse(data []byte) ([]Entry, error) {
	var es []Entry
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&es); err != nil {
		return nil, fmt.Errorf("codes.json: %w", err)
	}
	seen := map[string]bool{}
	for i, e := range es {
		switch {
		case e.Code < 400 || e.Code > 599:
			return nil, fmt.Errorf("codes.json entry %d: code %d, want 400..599", i, e.Code)
		case !nameRe.MatchString(e.Name):
			return nil, fmt.Errorf("codes.json entry %d: name %q, want lower_snake_case", i, e.Name)
		case !constRe.MatchString(e.Const):
			return nil, fmt.Errorf("codes.json entry %d: const %q, want CodeSomething", i, e.Const)
		case strings.TrimSpace(e.Meaning) == "" || strings.Contains(e.Meaning, "\n"):
			return nil, fmt.Errorf("codes.json entry %d (%s): meaning must be one non-empty line", i, e.Name)
		}
		for _, k := range []string{fmt.Sprint(e.Code), e.Name, e.Const} {
			if seen[k] {
				return nil, fmt.Errorf("codes.json: %s appears twice", k)
			}
			seen[k] = true
		}
	}
	slices.SortFunc(es, func(a, b Entry) int { return a.Code - b.Code })
	return es, nil
}

// Go renders codes_gen.go of package api.
func Go(es []Entry) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString("// Code generated from codes.json by `go generate ./api` (api/gencodes); DO NOT EDIT.\n\npackage api\n\n")
	b.WriteString("// The error table. Engine shims branch on these numbers; they never change meaning.\nconst (\n")
	for _, e := range es {
		fmt.Fprintf(&b, "\t%s Code = %d // %s\n", e.Const, e.Code, plain(e.Meaning))
	}
	b.WriteString(")\n\n// codeNames gives every code a stable name for logs and docs.\nvar codeNames = map[Code]string{\n")
	for _, e := range es {
		fmt.Fprintf(&b, "\t%s: %q,\n", e.Const, e.Name)
	}
	b.WriteString("}\n")
	return format.Source(b.Bytes())
}

// Markdown renders the README table, between Begin and End.
func Markdown(es []Entry) string {
	var b strings.Builder
	b.WriteString(Begin + "\n\n| code | name | meaning |\n| --- | --- | --- |\n")
	for _, e := range es {
		fmt.Fprintf(&b, "| %d | %s | %s |\n", e.Code, e.Name, e.Meaning)
	}
	b.WriteString("\n" + End)
	return b.String()
}

// Splice replaces the generated table in readme (between Begin and End)
// with table.
func Splice(readme, table string) (string, error) {
	i, j := strings.Index(readme, Begin), strings.Index(readme, End)
	if i < 0 || j < i {
		return "", fmt.Errorf("README.md has no %q ... %q block", Begin, End)
	}
	return readme[:i] + table + readme[j+len(End):], nil
}

// plain is a meaning without Markdown backquotes, for a Go comment.
func plain(s string) string { return strings.ReplaceAll(s, "`", "") }
