package codetable

import (
	"bytes"
	"fmt"
	"go/format"
)

// header opens every generated Go file.
const header = "// Code generated from api/codes.json by `go generate ./api` (api/gencodes); DO NOT EDIT.\n\n"

// APIGo renders api/codes_gen.go: package api's constants and names.
func APIGo(t Table) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(header + "package api\n\n")
	b.WriteString("// The error table. Engine shims branch on these numbers; they never change meaning.\nconst (\n")
	for _, e := range t.NATS {
		fmt.Fprintf(&b, "\t%s Code = %d // %s\n", e.Const, e.Code, plain(e.Meaning))
	}
	b.WriteString(")\n\n// codeNames gives every code a stable name for logs and docs.\nvar codeNames = map[Code]string{\n")
	for _, e := range t.NATS {
		fmt.Fprintf(&b, "\t%s: %q,\n", e.Const, e.Name)
	}
	b.WriteString("}\n")
	return format.Source(b.Bytes())
}

// ShimGo renders engine/shim/reasons_gen.go: the load-failure codes that do not
// read as their name (shim.Reason).
func ShimGo(t Table) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(header + "package shim\n\nimport \"github.com/connex/connex/api\"\n\n")
	b.WriteString("// loadReasons names the load-failure codes that do not read as their\n// name (Reason).\nvar loadReasons = map[api.Code]string{\n")
	for _, e := range t.NATS {
		if e.Reason != "" {
			fmt.Fprintf(&b, "\tapi.%s: %q,\n", e.Const, e.Reason)
		}
	}
	b.WriteString("}\n")
	return format.Source(b.Bytes())
}

// RouterGo renders router/codes_gen.go: the router's error codes and the
// list of them its metrics label with.
func RouterGo(t Table) ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(header + "package router\n\n")
	b.WriteString("// The router's error codes (APIError.Code): what it answers with, and the\n" +
		"// engines' codes it acts on. Clients branch on these strings; they never\n// change meaning.\nconst (\n")
	for _, e := range t.HTTP {
		fmt.Fprintf(&b, "\t%s = %q // %s: %s%s\n", e.Const, e.Code, e.Status, plain(e.Meaning), mirrors(t, e))
	}
	b.WriteString(")\n\n// routerCodes is every code above: the values connex_router_errors_total's\n// code label may take (codeLabel).\nvar routerCodes = []string{\n")
	for _, e := range t.HTTP {
		fmt.Fprintf(&b, "\t%s,\n", e.Const)
	}
	b.WriteString("}\n")
	return format.Source(b.Bytes())
}

// mirrors is "; mirrors NATS code N (name)" for an HTTP code that mirrors
// one, else "".
func mirrors(t Table, e HTTPEntry) string {
	if n, ok := t.mirrored(e); ok {
		return fmt.Sprintf("; mirrors NATS code %d (%s)", n.Code, n.Name)
	}
	return ""
}
