// Package e2e runs connexd as real OS processes on a real NATS server and
// drives them through the subject API as an engine shim would.
package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/engine/shim"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/kvmem/regionfile"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/connex/connex/harness/poll"
)

var connexdBin string

func TestMain(m *testing.M) {
	if spec := os.Getenv(relayEnv); spec != "" {
		os.Exit(runFloorRelay(spec)) // a process of make bench-pull's NATS floor, not a test run
	}
	dir, err := os.MkdirTemp("", "connexd-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	connexdBin = filepath.Join(dir, "connexd")
	args := []string{"build", "-o", connexdBin}
	if tags := buildTags(); tags != "" {
		args = append(args, "-tags", tags)
	}
	cmd := exec.Command("go", append(args, "../../cmd/connexd")...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build connexd:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// checkFor polls fn until it returns nil; poll.Until fails the test with
// fn's last error once total has passed.
func checkFor(t testing.TB, total, every time.Duration, fn func() error) {
	t.Helper()
	poll.Until(t, total, every, fn)
}

// proc is one connexd OS process.
type proc struct {
	t       testing.TB
	cmd     *exec.Cmd
	name    string // "connexd" or "connex-sim", for messages
	member  string // connexd's member id, or the sim's engine id
	natsURL string
	// httpURL is the router's HTTP base URL (role router) or the sim's,
	// from the ready line.
	httpURL string
	// metricsURL is where connexd serves Prometheus metrics (metrics_listen).
	metricsURL string
	// pprofURL is where connexd serves Go's profiles (pprof_listen).
	pprofURL string
	// authDir is the authority of connexd's embedded NATS (auth=), "" when
	// it runs none.
	authDir string
	// dataAddr is connexd's data-plane address as its ready line prints it
	// (data=; host:port for TCP).
	dataAddr string
	mu       sync.Mutex
	stderr   strings.Builder
	exited   chan struct{}
}

// startConnexd starts connexd with args and waits for its ready line.
func startConnexd(t testing.TB, member string, args ...string) *proc {
	t.Helper()
	all := append([]string{"--member-id", member, "--data-dir", t.TempDir(), "--log-level", "info"}, args...)
	for i, a := range args {
		if a == "--nats-url" && i+1 < len(args) {
			all = append(all, credsFlags(t, args[i+1], "--nats-creds", "--role", "member", "--member", member)...)
		}
	}
	return startProc(t, "connexd", connexdBin, member, all, "CONNEX_NATS_LISTEN=127.0.0.1:0")
}

// startProc starts binary bin (connexd or connex-sim) with args and waits
// for its "<name> ready" line, whose nats=, http= and metrics= fields it
// keeps. The process is stopped (SIGTERM) at the end of the test.
func startProc(t testing.TB, name, bin, member string, args []string, env ...string) *proc {
	t.Helper()
	return startCmd(t, name, member, exec.Command(bin, args...), args, env...)
}

// startCmd is startProc for a command made elsewhere (on a netlab host:
// Host.Command); args are the ones it was made with.
func startCmd(t testing.TB, name, member string, cmd *exec.Cmd, args []string, env ...string) *proc {
	t.Helper()
	cmd.Env = append(os.Environ(), env...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, name: name, member: member, exited: make(chan struct{})}
	errPipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(errPipe)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			p.mu.Lock()
			p.stderr.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
		_, _ = io.Copy(io.Discard, errPipe)
	}()
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if line := sc.Text(); strings.HasPrefix(line, name+" ready") {
				ready <- line
			}
		}
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		p.stop()
		if t.Failed() {
			logs := p.logs()
			if len(logs) > 6000 {
				logs = "…" + logs[len(logs)-6000:]
			}
			t.Logf("%s %s log:\n%s", name, member, logs)
		}
	})
	select {
	case line := <-ready:
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "nats="); ok {
				p.natsURL = v
			}
			if v, ok := strings.CutPrefix(f, "http="); ok {
				p.httpURL = v
			}
			if v, ok := strings.CutPrefix(f, "pprof="); ok {
				p.pprofURL = v
			}
			if v, ok := strings.CutPrefix(f, "metrics="); ok {
				p.metricsURL = v
			}
			if v, ok := strings.CutPrefix(f, "auth="); ok {
				p.authDir = v
			}
			if v, ok := strings.CutPrefix(f, "data="); ok {
				p.dataAddr = v
			}
		}
		// Entries end with the test: a later test's server may get the same
		// port (and so the same URL) without this authority or CA.
		if p.authDir != "" {
			url, dir := p.natsURL, p.authDir
			authorities.Store(url, dir)
			t.Cleanup(func() { authorities.CompareAndDelete(url, dir) })
		}
		for i, a := range args {
			if a == "--nats-tls-ca" && i+1 < len(args) && !slices.Contains(args, "--nats-url") {
				url, ca := p.natsURL, args[i+1]
				tlsCAs.Store(url, ca)
				t.Cleanup(func() { tlsCAs.CompareAndDelete(url, ca) })
			}
		}
	case <-p.exited:
		t.Fatalf("%s %s exited before ready:\n%s", name, member, p.logs())
	case <-time.After(20 * time.Second):
		t.Fatalf("%s %s not ready within 20s:\n%s", name, member, p.logs())
	}
	return p
}

func (p *proc) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

// running reports whether the process is still alive.
func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

func (p *proc) signal(s syscall.Signal) { _ = p.cmd.Process.Signal(s) }

// kill SIGKILLs the process and waits until it is gone.
func (p *proc) kill() {
	p.signal(syscall.SIGKILL)
	<-p.exited
}

// stop asks connexd to shut down and kills it if it does not within 10s.
func (p *proc) stop() {
	if !p.running() {
		return
	}
	p.signal(syscall.SIGCONT)
	p.signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		p.t.Errorf("%s %s did not stop on SIGTERM within 10s", p.name, p.member)
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
}

// authorities maps the NATS URL of a connexd's embedded, authenticated
// server to its authority directory, so that the processes and clients a
// test connects to it get credentials, as an operator's would.
var authorities sync.Map

// tlsCAs maps the NATS URL of a connexd's embedded TLS server to the CA
// that verifies it (its --nats-tls-ca).
var tlsCAs sync.Map

// credsFlags mints credentials for an identity (`connexd auth creds`, the
// operator's way) when url is an authenticated embedded server, and
// returns flag and the file; none otherwise.
func credsFlags(t testing.TB, url, flag string, id ...string) []string {
	t.Helper()
	dir, ok := authorities.Load(url)
	if !ok {
		return nil
	}
	path := filepath.Join(t.TempDir(), "nats.creds")
	args := append([]string{"auth", "creds", "--dir", dir.(string), "-o", path}, id...)
	if out, err := exec.Command(connexdBin, args...).CombinedOutput(); err != nil {
		t.Fatalf("connexd %v: %v\n%s", args, err, out)
	}
	return []string{flag, path}
}

// adminCreds is the admin credentials file of an authenticated embedded
// server at url, or "".
func adminCreds(url string) string {
	dir, ok := authorities.Load(url)
	if !ok {
		return ""
	}
	return filepath.Join(dir.(string), "admin.creds")
}

// connect connects to url as the operator would: with the admin
// credentials of an authenticated embedded server.
func connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	var opts []nats.Option
	if f := adminCreds(url); f != "" {
		opts = append(opts, nats.UserCredentials(f))
	}
	return dial(t, url, opts...)
}

// dial connects to url with opts and, when url serves TLS, the server's CA;
// the connection closes when the test ends.
func dial(t testing.TB, url string, opts ...nats.Option) *nats.Conn {
	t.Helper()
	if ca, ok := tlsCAs.Load(url); ok {
		opts = append(opts, nats.RootCAs(ca.(string)))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// engine plays an inference engine: it owns a region file and talks to its
// local connexd.
type engine struct {
	id     string
	region *kvmem.Region
	rid    string
	cli    *api.Client
}

func shmDir(t testing.TB) string {
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		dir, err := os.MkdirTemp("/dev/shm", "connex-test-")
		if err == nil {
			t.Cleanup(func() { os.RemoveAll(dir) })
			return dir
		}
	}
	return t.TempDir()
}

func newEngine(t testing.TB, nc *nats.Conn, member, id string, l kvmem.Layout, fill bool) *engine {
	t.Helper()
	path := filepath.Join(shmDir(t), id+".kv")
	r, err := regionfile.Create(path, l)
	if err != nil {
		t.Fatal(err)
	}
	return registerEngine(t, &api.Client{NC: nc, Member: member}, id, r, fill)
}

// newEngineAt plays an engine that maps its existing region file at path
// and registers it through cli.
func newEngineAt(t testing.TB, cli *api.Client, id, path string, l kvmem.Layout, fill bool) *engine {
	t.Helper()
	r, err := regionfile.Open(path, l)
	if err != nil {
		t.Fatal(err)
	}
	return registerEngine(t, cli, id, r, fill)
}

// registerEngine fills r with random bytes if asked and registers it as
// region r0 of engine id.
func registerEngine(t testing.TB, cli *api.Client, id string, r *kvmem.Region, fill bool) *engine {
	t.Helper()
	path, l := r.Path, r.Layout
	t.Cleanup(func() { r.Close() })
	if fill {
		if _, err := rand.Read(r.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	e := &engine{id: id, region: r, rid: "r0", cli: cli}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := e.cli.RegisterRegion(ctx, &messages.RegisterRegionRequest{
		EngineId: id, RegionId: e.rid, Path: path,
		Layout: &messages.Layout{NumLayers: l.Layers, KvPlanes: l.Planes, NumBlocks: l.Blocks, BlockBytes: l.BlockBytes, BlockSize: l.BlockSize, TpSize: l.TPSize},
	}); err != nil {
		t.Fatalf("register region of %s: %v", id, err)
	}
	return e
}

// newCreatedEngine plays an engine whose region connexd creates
// (region.create): it maps the returned path, as an engine shim would.
func newCreatedEngine(t testing.TB, nc *nats.Conn, member, id string, l kvmem.Layout, fill bool) (*engine, *messages.RegionInfo) {
	t.Helper()
	return newCreatedEngineAs(t, &api.Client{NC: nc, Member: member}, id, l, fill)
}

// newCreatedEngineAs is newCreatedEngine calling through cli (an
// engine-scoped client, for one with engine credentials).
func newCreatedEngineAs(t testing.TB, cli *api.Client, id string, l kvmem.Layout, fill bool) (*engine, *messages.RegionInfo) {
	t.Helper()
	e := &engine{id: id, rid: "r0", cli: cli}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := e.cli.CreateRegion(ctx, &messages.CreateRegionRequest{
		EngineId: id, RegionId: e.rid,
		Layout: &messages.Layout{NumLayers: l.Layers, KvPlanes: l.Planes, NumBlocks: l.Blocks, BlockBytes: l.BlockBytes, BlockSize: l.BlockSize, TpSize: l.TPSize},
	})
	if err != nil {
		t.Fatalf("create region of %s: %v", id, err)
	}
	r, err := shim.MapCreated(ctx, info, l)
	if err != nil {
		t.Fatalf("map the created region %s: %v", info.Path, err)
	}
	t.Cleanup(func() { r.Close() })
	if fill {
		if _, err := rand.Read(r.Bytes()); err != nil {
			t.Fatal(err)
		}
	}
	e.region = r
	return e, info
}

func ctx5(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// notices collects protobuf notices from a subject.
type notices[T proto.Message] struct {
	mu  sync.Mutex
	got []T
}

func subscribe[T proto.Message](t testing.TB, nc *nats.Conn, subject string, mk func() T) *notices[T] {
	t.Helper()
	n := &notices[T]{}
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		v := mk()
		if err := proto.Unmarshal(m.Data, v); err != nil {
			t.Errorf("bad notice on %s: %v", subject, err)
			return
		}
		n.mu.Lock()
		n.got = append(n.got, v)
		n.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return n
}

func (n *notices[T]) all() []T {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]T(nil), n.got...)
}

// wait polls until pred holds for some notice and returns it.
func (n *notices[T]) wait(t testing.TB, total time.Duration, pred func(T) bool) T {
	t.Helper()
	var found T
	checkFor(t, total, 5*time.Millisecond, func() error {
		for _, v := range n.all() {
			if pred(v) {
				found = v
				return nil
			}
		}
		return fmt.Errorf("no matching notice among %d", len(n.all()))
	})
	return found
}
