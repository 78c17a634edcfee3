package layering

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/connex/connex/"

// rules is ARCHITECTURE.md's package table: for each package, the module
// packages it may import and the external import path prefixes it may use
// (the standard library is always allowed, except where io says so).
var rules = map[string]struct {
	internal []string
	external []string
	// pure packages make decisions only: no sockets, files, processes or
	// system calls.
	pure bool
}{
	"lease": {pure: true},
	// natssubject is the rule for ids spliced into NATS subjects (api,
	// auth and cluster accept ids with it).
	"natssubject": {pure: true},
	// clock is the time seam (Clock, Real, Fake): no I/O.
	"clock":             {pure: true},
	"notices":           {pure: true},
	"advertise":         {internal: []string{"messages"}, external: []string{"google.golang.org/protobuf/"}, pure: true},
	"kvmem":             {pure: true},
	"kvmem/regionfile":  {internal: []string{"kvmem"}, external: []string{"golang.org/x/sys/unix"}}, // kvmem's Regions from files: mmap, memfd, fallocate, openat2, /proc
	"kvmem/handover":    {external: []string{"golang.org/x/sys/unix"}},                              // created regions' descriptors over a unix socket (SCM_RIGHTS)
	"kvmem/kvfill":      {internal: []string{"kvmem"}, pure: true},                                  // deterministic KV element by element, for tests and benchmarks of pulls
	"transport":         {},
	"transport/tcp":     {internal: []string{"transport"}, external: []string{"golang.org/x/sys/unix"}}, // readv(2) (recvbuf.go)
	"transport/ucx":     {internal: []string{"transport", "transport/memcopy"}, external: []string{"golang.org/x/sys/unix"}},
	"transport/memcopy": {external: []string{"golang.org/x/sys/cpu"}},
	"messages":          {external: []string{"google.golang.org/protobuf/"}},
	// api is the wire: subjects, codec, error table, client, service. It
	// knows no domain package; errcode maps their errors to its codes.
	"api":     {internal: []string{"messages", "natssubject"}, external: []string{"github.com/nats-io/nats.go", "google.golang.org/protobuf/"}},
	"errcode": {internal: []string{"api", "kvmem", "lease", "requests", "transport"}, pure: true},
	// The error table's generator: pure rendering, and the command that
	// writes its files (and the connector's subject table, from api's).
	"api/codetable": {pure: true},
	"api/gencodes":  {internal: []string{"api", "api/codetable"}},
	"requests":      {internal: []string{"messages"}, external: []string{"github.com/nats-io/nats.go", "google.golang.org/protobuf/"}},
	// requests/activation decides one activation of a decode request (the
	// request actor's core): pure, on requests' state transitions.
	"requests/activation": {internal: []string{"messages", "requests"}, pure: true},
	"cluster":             {internal: []string{"messages", "natssubject"}, external: []string{"github.com/asynkron/protoactor-go/", "github.com/nats-io/nats.go", "google.golang.org/grpc", "google.golang.org/protobuf/"}},
	"actors":              {internal: []string{"api", "clock", "errcode", "kvmem", "lease", "messages", "requests", "requests/activation", "transport"}, external: []string{"github.com/asynkron/protoactor-go/", "github.com/nats-io/nats.go", "google.golang.org/protobuf/"}},
	// pull is the decode side of a transfer: the puller, its pure machine,
	// read planning and translations; the hold side's actors give it the
	// layout conversions and the metrics.
	"pull":             {internal: []string{"actors", "api", "clock", "errcode", "kvmem", "messages", "transport", "transport/memcopy"}, external: []string{"github.com/nats-io/nats.go", "google.golang.org/protobuf/"}},
	"natsbus":          {internal: []string{"auth"}, external: []string{"github.com/nats-io/", "golang.org/x/sys/unix"}},
	"auth":             {internal: []string{"natssubject"}, external: []string{"github.com/nats-io/jwt/", "github.com/nats-io/nkeys"}},
	"config":           {external: []string{"github.com/spf13/"}},
	"router":           {internal: []string{"clock", "messages"}, external: []string{"github.com/prometheus/client_golang/", "github.com/valyala/fastjson"}},
	"engine/shim":      {internal: []string{"api", "kvmem", "kvmem/handover", "kvmem/regionfile", "messages"}, external: []string{"github.com/nats-io/nats.go", "google.golang.org/protobuf/"}},
	"engine/simengine": {internal: []string{"kvmem", "messages", "engine/shim"}, external: []string{"github.com/prometheus/client_golang/", "google.golang.org/protobuf/"}},
	"clusterstatus":    {internal: []string{"api", "messages"}, external: []string{"github.com/nats-io/nats.go"}},
	// harness/chaos drives the product as an operator would: localcluster's
	// processes, the router over HTTP, notices and member.status over NATS.
	"harness/chaos": {internal: []string{"api", "harness/localcluster", "messages"}, external: []string{"github.com/nats-io/", "google.golang.org/protobuf/", "go.yaml.in/yaml/v3", "gonum.org/v1/plot"}},
	// localcluster runs binaries; it imports nothing of ours.
	"harness/localcluster": {},
	// netlab builds network-namespace hosts with ip and nft; nothing of ours.
	"harness/netlab": {},
	"daemon": {internal: []string{"actors", "api", "auth", "natsbus", "clock", "cluster", "config", "advertise", "errcode", "kvmem", "kvmem/handover", "kvmem/regionfile", "lease", "messages", "notices", "pull", "requests", "requests/activation", "router", "transport", "transport/tcp", "transport/ucx"},
		external: []string{"github.com/asynkron/protoactor-go/", "github.com/nats-io/", "github.com/prometheus/client_golang/", "google.golang.org/protobuf/"}},
	"harness/layering": {},
	// poll is for tests: wait for a condition with a deadline (and a log
	// buffer to wait on).
	"harness/poll": {pure: true},
}

// ioPackages are what a pure package may not import.
var ioPackages = []string{"net", "net/http", "os", "os/exec", "syscall", "golang.org/x/sys/unix", "io/fs", "path/filepath"}

type pkg struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
	CgoFiles     []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-tags", "ucx", "-json", module+"...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestImportsFollowTheTable fails when a package imports what its row of
// the table does not allow, a pure package does I/O, a package outside
// transport/ucx uses cgo, or a package has no row (add one, and to
// ARCHITECTURE.md).
func TestImportsFollowTheTable(t *testing.T) {
	pkgs := listPackages(t)
	if len(pkgs) < 20 {
		t.Fatalf("go list found %d packages", len(pkgs))
	}
	for _, p := range pkgs {
		name := strings.TrimPrefix(p.ImportPath, module)
		if name == "harness/e2e" || strings.HasPrefix(name, "cmd/") {
			continue // binaries and tests of the whole: they may use anything
		}
		if len(p.CgoFiles) > 0 && name != "transport/ucx" {
			t.Errorf("%s uses cgo (%v): only transport/ucx may", name, p.CgoFiles)
		}
		r, ok := rules[name]
		if !ok {
			t.Errorf("%s has no row in the layering table (layering_test.go and ARCHITECTURE.md)", name)
			continue
		}
		for _, imp := range p.Imports {
			switch {
			case strings.HasPrefix(imp, module):
				if dep := strings.TrimPrefix(imp, module); !slices.Contains(r.internal, dep) {
					t.Errorf("%s imports %s, which its row does not allow", name, dep)
				}
			case strings.Contains(strings.SplitN(imp, "/", 2)[0], "."):
				if !slices.ContainsFunc(r.external, func(pre string) bool { return strings.HasPrefix(imp, pre) }) {
					t.Errorf("%s imports %s, which its row does not allow", name, imp)
				}
			}
			if r.pure && slices.Contains(ioPackages, imp) {
				t.Errorf("%s decides and must not do I/O, but imports %s", name, imp)
			}
		}
	}
}
