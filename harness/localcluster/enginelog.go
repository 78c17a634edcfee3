package localcluster

import (
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// engineLog is where engine name's `vllm serve` output goes: with
// VLLM.LogDir, its own file there (truncated at the engine's first start in
// this cluster, appended across its restarts, kept after Close); otherwise
// the cluster's Log with every other process.
func (c *Cluster) engineLog(name string) (*lineLog, error) {
	v := c.opts.VLLM
	if v == nil || v.LogDir == "" {
		return c.log, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.engineLogs[name]; ok {
		fmt.Fprintf(l.w, "== %s: started again\n", time.Now().Format(time.RFC3339))
		return l, nil
	}
	if err := os.MkdirAll(v.LogDir, 0o755); err != nil {
		return nil, fmt.Errorf("localcluster: engine log dir: %w", err)
	}
	f, err := os.OpenFile(EngineLogPath(v.LogDir, name), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("localcluster: %s's engine log: %w", name, err)
	}
	if c.engineLogs == nil {
		c.engineLogs = map[string]*lineLog{}
	}
	l := &lineLog{w: f}
	c.engineLogs[name] = l
	return l, nil
}

// closeEngineLogs closes the engines' log files (Close, once the engines
// stopped).
func (c *Cluster) closeEngineLogs() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var first error
	for name, l := range c.engineLogs {
		if err := l.w.(*os.File).Close(); err != nil && first == nil {
			first = fmt.Errorf("localcluster: close %s's engine log: %w", name, err)
		}
	}
	c.engineLogs = nil
	return first
}

// EngineLogPath is the file engine name's output goes to under dir
// (VLLM.LogDir).
func EngineLogPath(dir, name string) string {
	return filepath.Join(dir, name+".log")
}
