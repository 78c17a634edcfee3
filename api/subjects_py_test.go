package api

import (
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestPythonSubjectsAreCurrent: the vLLM connector's subject table is what
// api/subjects.go generates now (run `make generate` after changing an
// endpoint or its scope), and Endpoints holds every endpoint Serve
// registers.
func TestPythonSubjectsAreCurrent(t *testing.T) {
	got, err := os.ReadFile(filepath.Join("..", PythonSubjectsPath))
	if err != nil || !bytes.Equal(got, PythonSubjects()) {
		t.Fatalf("%s is not what api/subjects.go generates (%v): run make generate", PythonSubjectsPath, err)
	}
	nc, _ := startServer(t)
	svc, err := Serve(nc, &descHandler{}, ServeOptions{Member: "m1", Version: "0.0.1", MaxRequestBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	served := map[string]bool{}
	for _, ep := range svc.Info().Endpoints {
		served[ep.Subject] = true
	}
	for _, ep := range Endpoints {
		if !served[Subject("m1", ep)] {
			t.Errorf("Endpoints lists %s, which Serve does not register", ep)
		}
		delete(served, Subject("m1", ep))
		if EngineScoped(ep) {
			delete(served, EngineSubject("m1", "*", ep))
		}
	}
	for s := range served {
		t.Errorf("Serve registers %s, which Endpoints (and so the connector's table) lacks", s)
	}
}

// TestNoticeKindsListsEveryKind: NoticeKinds (and so the connector's
// NOTICE_KINDS) holds every Kind* constant api/subjects.go declares.
func TestNoticeKindsListsEveryKind(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "subjects.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	declared := 0
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, spec := range g.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if !strings.HasPrefix(name.Name, "Kind") || i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok {
					continue
				}
				declared++
				if kind, _ := strconv.Unquote(lit.Value); !slices.Contains(NoticeKinds, kind) {
					t.Errorf("%s = %s is not in NoticeKinds", name.Name, lit.Value)
				}
			}
		}
	}
	if declared != len(NoticeKinds) {
		t.Errorf("subjects.go declares %d notice kinds, NoticeKinds lists %d", declared, len(NoticeKinds))
	}
}
