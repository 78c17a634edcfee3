package api

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/connex/connex/api/codetable"
)

// TestGeneratedCodesAreCurrent: every copy of the error table (the Go
// constants of api and router, the shim's load-failure reasons, the Python
// connector's codes module, docs/api.md's tables) is what codes.json
// generates now, so editing one copy by hand fails here (run `make
// generate` after editing codes.json); and every code has its name.
func TestGeneratedCodesAreCurrent(t *testing.T) {
	data, err := os.ReadFile("codes.json")
	if err != nil {
		t.Fatal(err)
	}
	table, err := codetable.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	files, err := codetable.Files(table)
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 4 {
		t.Fatalf("%d generated files, want api's, router's, shim's and the connector's", len(files))
	}
	for _, f := range files {
		if got, err := os.ReadFile(filepath.Join("..", f.Path)); err != nil || !bytes.Equal(got, f.Data) {
			t.Errorf("%s is not what codes.json generates (%v): run make generate", f.Path, err)
		}
	}
	readme, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	if want, err := codetable.Doc(string(readme), table); err != nil || want != string(readme) {
		t.Errorf("docs/api.md's error tables are not what codes.json generates (%v): run make generate", err)
	}
	for _, e := range table.NATS {
		if Code(e.Code).Name() != e.Name {
			t.Errorf("code %d is named %q, codes.json says %q", e.Code, Code(e.Code).Name(), e.Name)
		}
	}
}
