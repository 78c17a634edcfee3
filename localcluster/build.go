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

// ErrMissing means a binary's package is not in this source tree (yet).
var ErrMissing = errors.New("localcluster: package not in the source tree")

// Binaries are the paths of the binaries a cluster runs.
type Binaries struct {
	Connexd string
	Sim     string
}

// Build compiles connexd and connex-sim into outDir with `go build` (tags,
// e.g. "ucx", may be empty), from the module that holds the current
// directory. For tests and benchmarks; `make run` builds with make. An
// error wrapping ErrMissing means cmd/connex-sim or cmd/connexd is not in
// the tree.
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
	for _, p := range pkgs {
		if _, err := os.Stat(filepath.Join(root, p, "main.go")); err != nil {
			return Binaries{}, fmt.Errorf("%w: %s", ErrMissing, p)
		}
	}
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

// HasRouter reports whether the connexd binary has the router's HTTP front
// door (its --help lists --http-listen).
func HasRouter(ctx context.Context, connexd string) (bool, error) {
	out, err := exec.CommandContext(ctx, connexd, "--help").CombinedOutput()
	if err != nil && len(out) == 0 {
		return false, fmt.Errorf("localcluster: %s --help: %w", connexd, err)
	}
	return strings.Contains(string(out), "--http-listen"), nil
}
