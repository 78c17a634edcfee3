package codetable

import (
	"fmt"
	"strings"
)

// pyWidth is the connector's line length
// (engine/vllm-connector/pyproject.toml, ruff).
const pyWidth = 120

// Python renders engine/vllm-connector/connex_vllm/codes.py: the NATS codes as
// CODE_<NAME> constants, their names and load-failure reasons, typed and
// as `ruff format` writes it.
func Python(t Table) []byte {
	var b strings.Builder
	b.WriteString("# Code generated from api/codes.json by `go generate ./api` (api/gencodes); DO NOT EDIT.\n")
	b.WriteString(`"""The stable error codes of connexd's NATS subject API (header ` + "``Nats-Service-Error-Code``" + `), their names, and how a
failed KV load reads.

Generated from api/codes.json, the one table every language shares: edit it and run ` + "``make generate``" + ` (or
` + "``go generate ./api``" + `). ` + "``reason``" + ` names a failure as the Go shim does (` + "``shim.Reason``" + `).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

`)
	for _, e := range t.NATS {
		for _, line := range wrap(plain(e.Meaning), pyWidth-2) {
			b.WriteString("# " + line + "\n")
		}
		fmt.Fprintf(&b, "%s: Final = %d\n", pyConst(e), e.Code)
	}
	b.WriteString("\nNAMES: Final[Mapping[int, str]] = {\n")
	for _, e := range t.NATS {
		fmt.Fprintf(&b, "    %s: %q,\n", pyConst(e), e.Name)
	}
	b.WriteString("}\n\"\"\"Every code's stable name (what connexd's logs and error bodies call it).\"\"\"\n")
	b.WriteString("\n_REASONS: Final[Mapping[int, str]] = {\n")
	for _, e := range t.NATS {
		if e.Reason != "" {
			fmt.Fprintf(&b, "    %s: %q,\n", pyConst(e), e.Reason)
		}
	}
	b.WriteString(`}


def name(code: int) -> str:
    """The stable name of ` + "``code``" + ` (` + "``code_<n>``" + ` for a code this table does not know, as connexd says)."""
    return NAMES.get(code, f"code_{code}")


def reason(code: int) -> str:
    """Names a load-failure code the way an operator reads it: its reason, else its name."""
    return _REASONS.get(code) or name(code)
`)
	return []byte(b.String())
}

// pyConst is e's Python constant: CODE_ and its name in capitals.
func pyConst(e Entry) string { return "CODE_" + strings.ToUpper(e.Name) }

// wrap breaks s into lines of at most width runes, at spaces (a longer
// word stands alone).
func wrap(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		switch {
		case line == "":
			line = w
		case len([]rune(line))+1+len([]rune(w)) <= width:
			line += " " + w
		default:
			lines = append(lines, line)
			line = w
		}
	}
	return append(lines, line)
}
