package api

import (
	"bytes"
	"os"
	"testing"

	"github.com/connex/connex/api/codetable"
)

// TestGeneratedCodesAreCurrent: codes_gen.go and README.md's error table
// are what codes.json says (run `go generate ./api` after editing it), and
// every code has a name.
func TestGeneratedCodesAreCurrent(t *testing.T) {
	data, err := os.ReadFile("codes.json")
	if err != nil {
		t.Fatal(err)
	}
	es, err := codetable.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	src, err := codetable.Go(es)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile("codes_gen.go"); err != nil || !bytes.Equal(got, src) {
		t.Fatalf("codes_gen.go is not what codes.json generates (%v): run go generate ./api", err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(readme, []byte(codetable.Markdown(es))) {
		t.Fatal("README.md's error-code table is not what codes.json generates: run go generate ./api")
	}
	for _, e := range es {
		if Code(e.Code).Name() != e.Name {
			t.Errorf("code %d is named %q, codes.json says %q", e.Code, Code(e.Code).Name(), e.Name)
		}
	}
}
