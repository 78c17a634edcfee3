// Package codetable turns api/codes.json, the one source of Connex's error
// codes, into every copy the code base keeps: the NATS API's constants and
// names (package api), how the shims name a failed KV load (package shim and
// the Python connector), the router's OpenAI error codes (package router),
// the Python connector's codes module, and docs/api.md's tables. It is pure:
// bytes in, bytes out; api/gencodes writes the files (`go generate ./api`,
// `make generate`) and a test in api fails when a committed copy drifts.
package codetable

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// Table is api/codes.json.
type Table struct {
	// NATS is the subject API's table: the numbers in the
	// Nats-Service-Error-Code header, sorted by code once parsed.
	NATS []Entry `json:"nats"`
	// HTTP is the router's table: the "code" of its OpenAI-shaped error
	// bodies, in the file's order (the README's).
	HTTP []HTTPEntry `json:"http"`
}

// Entry is one NATS API error code.
type Entry struct {
	Code    int    `json:"code"`
	Name    string `json:"name"`
	Const   string `json:"const"`   // the Go constant in package api
	Meaning string `json:"meaning"` // Markdown, one line
	// Reason is how a failed KV load with this code reads to an operator
	// (shim.Reason, connex_vllm.codes.reason) where that is not Name.
	Reason string `json:"reason,omitempty"`
}

// HTTPEntry is one of the router's error codes: one it answers with, or
// an engine's that it acts on.
type HTTPEntry struct {
	Code    string `json:"code"`
	Const   string `json:"const"`  // the Go constant in package router
	Status  string `json:"status"` // the HTTP status(es) it comes with, for the docs
	Meaning string `json:"meaning"`
	// NATS is the NATS code this one mirrors (0: none); Code must be that
	// code's name, so the two cannot drift apart.
	NATS int `json:"nats,omitempty"`
}

var (
	nameRe   = regexp.MustCompile(`^[a-z][a-z_]*$`)
	constRe  = regexp.MustCompile(`^Code[A-Z][A-Za-z]*$`)
	reasonRe = regexp.MustCompile(`^[a-z][a-z ]*[a-z]$`)
)

// Parse reads and checks the table: codes, names and constants unique and
// well-formed, meanings present, reasons plain words, every mirror naming
// a NATS code by its name. It sorts NATS by code.
func Parse(data []byte) (Table, error) {
	var t Table
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&t); err != nil {
		return Table{}, fmt.Errorf("codes.json: %w", err)
	}
	if len(t.NATS) == 0 || len(t.HTTP) == 0 {
		return Table{}, fmt.Errorf("codes.json: want both a nats and an http table")
	}
	names, codes := map[int]string{}, map[string]bool{}
	seen := map[string]bool{}
	unique := func(table string, keys ...string) error {
		for _, k := range keys {
			if seen[table+k] {
				return fmt.Errorf("codes.json: %s %s appears twice", table, k)
			}
			seen[table+k] = true
		}
		return nil
	}
	for i, e := range t.NATS {
		switch {
		case e.Code < 400 || e.Code > 599:
			return Table{}, fmt.Errorf("codes.json nats entry %d: code %d, want 400..599", i, e.Code)
		case !nameRe.MatchString(e.Name):
			return Table{}, fmt.Errorf("codes.json nats entry %d: name %q, want lower_snake_case", i, e.Name)
		case !constRe.MatchString(e.Const):
			return Table{}, fmt.Errorf("codes.json nats entry %d: const %q, want CodeSomething", i, e.Const)
		case !oneLine(e.Meaning):
			return Table{}, fmt.Errorf("codes.json nats entry %d (%s): meaning must be one non-empty line", i, e.Name)
		case e.Reason != "" && (!reasonRe.MatchString(e.Reason) || e.Reason == e.Name):
			return Table{}, fmt.Errorf("codes.json nats entry %d (%s): reason %q, want lower-case words other than the name", i, e.Name, e.Reason)
		}
		if err := unique("nats", fmt.Sprint(e.Code), e.Name, e.Const); err != nil {
			return Table{}, err
		}
		names[e.Code], codes[e.Name] = e.Name, true
	}
	for i, e := range t.HTTP {
		switch {
		case !nameRe.MatchString(e.Code):
			return Table{}, fmt.Errorf("codes.json http entry %d: code %q, want lower_snake_case", i, e.Code)
		case !constRe.MatchString(e.Const):
			return Table{}, fmt.Errorf("codes.json http entry %d: const %q, want CodeSomething", i, e.Const)
		case !oneLine(e.Meaning) || !oneLine(e.Status):
			return Table{}, fmt.Errorf("codes.json http entry %d (%s): status and meaning must be one non-empty line each", i, e.Code)
		case e.NATS != 0 && names[e.NATS] != e.Code:
			return Table{}, fmt.Errorf("codes.json http entry %d (%s): mirrors NATS code %d, whose name is %q", i, e.Code, e.NATS, names[e.NATS])
		case e.NATS == 0 && codes[e.Code]:
			return Table{}, fmt.Errorf("codes.json http entry %d (%s): spelled like a NATS code: say which it mirrors (\"nats\")", i, e.Code)
		}
		if err := unique("http", e.Code, e.Const); err != nil {
			return Table{}, err
		}
	}
	slices.SortFunc(t.NATS, func(a, b Entry) int { return a.Code - b.Code })
	return t, nil
}

// mirrored is the NATS entry e mirrors, if any.
func (t Table) mirrored(e HTTPEntry) (Entry, bool) {
	for _, n := range t.NATS {
		if e.NATS != 0 && n.Code == e.NATS {
			return n, true
		}
	}
	return Entry{}, false
}

func oneLine(s string) bool { return strings.TrimSpace(s) != "" && !strings.Contains(s, "\n") }

// plain is a meaning without Markdown backquotes, for a code comment.
func plain(s string) string { return strings.ReplaceAll(s, "`", "") }
