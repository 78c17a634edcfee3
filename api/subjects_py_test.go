package api

import (
	"bytes"
	"os"
	"path/filepath"
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
