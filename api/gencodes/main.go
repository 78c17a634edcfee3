// Command gencodes regenerates every copy of the error table from
// api/codes.json: api/codes_gen.go, router/codes_gen.go,
// engine/shim/reasons_gen.go, engine/vllm-connector/connex_vllm/codes.py and
// docs/api.md's tables, and the connector's subject table from api/subjects.go
// (connex_vllm/subjects_gen.py) (`go generate ./api`, or `make generate`).
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/connex/connex/api"
	"github.com/connex/connex/api/codetable"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "gencodes: %v\n", err)
		os.Exit(1)
	}
}

// run is invoked in api/ (go generate's directory): the repository root
// is its parent.
func run() error {
	data, err := os.ReadFile("codes.json")
	if err != nil {
		return err
	}
	t, err := codetable.Parse(data)
	if err != nil {
		return err
	}
	files, err := codetable.Files(t)
	if err != nil {
		return err
	}
	files = append(files, codetable.File{Path: api.PythonSubjectsPath, Data: api.PythonSubjects()})
	for _, f := range files {
		if err := os.WriteFile(filepath.Join("..", f.Path), f.Data, 0o644); err != nil {
			return err
		}
	}
	readmePath := filepath.Join("..", "docs", "api.md")
	readme, err := os.ReadFile(readmePath)
	if err != nil {
		return err
	}
	out, err := codetable.Doc(string(readme), t)
	if err != nil {
		return err
	}
	return os.WriteFile(readmePath, []byte(out), 0o644)
}
