// Command gencodes regenerates api/codes_gen.go and README.md's error-code
// table from api/codes.json (`go generate ./api`).
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/connex/connex/api/codetable"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "gencodes: %v\n", err)
		os.Exit(1)
	}
}

// run is invoked in api/ (go generate's directory).
func run() error {
	data, err := os.ReadFile("codes.json")
	if err != nil {
		return err
	}
	es, err := codetable.Parse(data)
	if err != nil {
		return err
	}
	src, err := codetable.Go(es)
	if err != nil {
		return err
	}
	if err := os.WriteFile("codes_gen.go", src, 0o644); err != nil {
		return err
	}
	readmePath := filepath.Join("..", "README.md")
	readme, err := os.ReadFile(readmePath)
	if err != nil {
		return err
	}
	out, err := codetable.Splice(string(readme), codetable.Markdown(es))
	if err != nil {
		return err
	}
	return os.WriteFile(readmePath, []byte(out), 0o644)
}
