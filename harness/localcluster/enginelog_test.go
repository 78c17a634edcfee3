package localcluster

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// TestLocalFakeVLLMLogsToFiles: with VLLM.LogDir each engine's own lines go
// to its file there, not to the cluster's Log, and the file outlives Close.
func TestLocalFakeVLLMLogsToFiles(t *testing.T) {
	needProc(t)
	o := fakeOptions(t)
	screen := &captureLog{}
	o.Log = screen
	dir, model := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(model, "config.json"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	o.VLLM = &VLLM{Bin: o.Sim, Model: model, LogDir: dir}
	c, err := Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	engines := c.Engines()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if len(engines) == 0 {
		t.Fatal("no engines")
	}
	for _, e := range engines {
		b, err := os.ReadFile(EngineLogPath(dir, e.Name))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "fake vllm serving") || !strings.Contains(string(b), `"engine_id":"`+e.Name+`"`) {
			t.Errorf("%s's log file lacks its own line:\n%s", e.Name, b)
		}
	}
	if strings.Contains(screen.String(), "fake vllm serving") {
		t.Errorf("an engine's line reached the screen:\n%s", screen.String())
	}
}

// captureLog keeps what the cluster writes to Options.Log.
type captureLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *captureLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *captureLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
