package localcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Binaries are the paths of the binaries a cluster runs.
type Binaries struct {
	Connexd string
	Sim     string
}

// Build compiles connexd and connex-sim into outDir with `go build` (tags,
// e.g. "ucx", may be empty), from the module that holds the current
// directory. For tests and benchmarks; `make run` builds with make.
func Build(ctx context.Context, outDir, tags string) (Binaries, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return Binaries{}, fmt.Errorf("localcluster: go env GOMOD: %w", err)
	}
	gomod := strings.TrimSpace(string(out))
	if gomod == "" || gomod == os.DevNull {
		return Binaries{}, errors.New("localcluster: Build must run inside the connex module")
	}
	root := filepath.Dir(gomod)
	pkgs := []string{"./cmd/connexd", "./cmd/connex-sim"}
	args := []string{"build", "-o", outDir + string(filepath.Separator)}
	if tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.CommandContext(ctx, "go", append(args, pkgs...)...)
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return Binaries{}, fmt.Errorf("localcluster: go build %s: %w\n%s", strings.Join(pkgs, " "), err, b)
	}
	return Binaries{Connexd: filepath.Join(outDir, "connexd"), Sim: filepath.Join(outDir, "connex-sim")}, nil
}
