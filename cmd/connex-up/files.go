package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"

	"github.com/connex/connex/harness/localcluster"
)

// clusterFiles are the files connex-up writes for the user.
type clusterFiles struct {
	env        string // <cluster dir>/connex.env
	stable     string // its copy at --env-file ("" none)
	stableData []byte // what was written there, to remove it only if still ours
	prometheus string // <cluster dir>/prometheus.yml
}

// writeFiles writes the env file (in the cluster's directory and at
// stable) and the Prometheus scrape configuration.
func writeFiles(c *localcluster.Cluster, stable string) (clusterFiles, error) {
	f := clusterFiles{env: filepath.Join(c.Dir(), "connex.env")}
	if err := c.WriteClientEnv(f.env); err != nil {
		return f, err
	}
	if stable != "" {
		if err := os.MkdirAll(filepath.Dir(stable), 0o700); err != nil {
			return f, fmt.Errorf("--env-file %s: %w", stable, err)
		}
		if err := c.WriteClientEnv(stable); err != nil {
			return f, fmt.Errorf("--env-file: %w", err)
		}
		data, err := os.ReadFile(stable)
		if err != nil {
			return f, fmt.Errorf("--env-file: %w", err)
		}
		f.stable, f.stableData = stable, data
	}
	var err error
	f.prometheus, err = c.WritePrometheusConfig()
	return f, err
}

// sourced is the env file the banner tells the user to source.
func (f clusterFiles) sourced() string {
	if f.stable != "" {
		return f.stable
	}
	return f.env
}

// removeStable removes the stable env file unless another connex-up has
// replaced it since: it must not point a shell at a cluster that is gone.
func (f clusterFiles) removeStable() {
	if f.stable == "" {
		return
	}
	if data, err := os.ReadFile(f.stable); err == nil && bytes.Equal(data, f.stableData) {
		_ = os.Remove(f.stable)
	}
}
