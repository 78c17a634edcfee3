package localcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
)

// The test binary plays connexd and connex-sim when LOCALCLUSTER_FAKE=1, so
// the launcher's process handling is tested without the real binaries: it
// prints their ready lines, serves /ready (router) and exits on SIGTERM.
// LOCALCLUSTER_FAKE_FAIL=<name> makes that member fail at start;
// LOCALCLUSTER_FAKE_STUBBORN=<name> makes it ignore SIGTERM. While the file
// LOCALCLUSTER_FAKE_FAILFILE names exists, every process fails at start;
// while LOCALCLUSTER_FAKE_HOLDFILE's exists, every process waits for SIGTERM
// before its ready line (a start that hangs). A connexd given
// --metrics-listen serves there and names it in its ready line.
func TestMain(m *testing.M) {
	if os.Getenv("LOCALCLUSTER_FAKE") == "1" {
		os.Exit(fakeMain(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func fakeMain(args []string) int {
	arg := func(flag string) string {
		if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
			return args[i+1]
		}
		return ""
	}
	if len(args) > 0 && args[0] == "serve" { // `vllm serve`: its /health, and a line of its own
		return fakeVLLM(arg)
	}
	sim := slices.Contains(args, "--nats")
	name := arg("--member-id")
	if sim {
		name = arg("--engine-id")
	}
	sig := make(chan os.Signal, 1)
	if os.Getenv("LOCALCLUSTER_FAKE_STUBBORN") == name {
		signal.Ignore(syscall.SIGTERM)
	} else {
		signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	}
	if os.Getenv("LOCALCLUSTER_FAKE_FAIL") == name || exists(os.Getenv("LOCALCLUSTER_FAKE_FAILFILE")) {
		fmt.Fprintf(os.Stderr, "boom: %s cannot start\n", name)
		return 1
	}
	if exists(os.Getenv("LOCALCLUSTER_FAKE_HOLDFILE")) {
		<-sig
		return 0
	}
	serve := func(addr string) string {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		// 200 for everything (/ready, /health) but the engine list, which
		// the fake router does not have.
		go http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/connex/v1/engines" {
				http.NotFound(w, r)
			}
		}))
		return ln.Addr().String()
	}
	metrics := ""
	if addr := arg("--metrics-listen"); addr != "" && !sim {
		metrics = " metrics=http://" + serve(addr) + "/metrics"
	}
	switch {
	case sim:
		fmt.Printf("connex-sim ready engine=%s role=%s http=http://%s member=%s\n",
			name, arg("--role"), serve(arg("--listen")), arg("--member"))
	case arg("--role") == "router":
		natsAddr := serve(arg("--nats-listen"))
		fmt.Printf("connexd ready member=%s nats=nats://%s backend=tcp data=127.0.0.1:1 role=router http=http://%s%s\n",
			name, natsAddr, serve(arg("--http-listen")), metrics)
	default:
		fmt.Printf("connexd ready member=%s nats=%s backend=tcp data=127.0.0.1:1 role=%s%s\n", name, arg("--nats-url"), arg("--role"), metrics)
	}
	<-sig
	return 0
}

// fakeVLLM plays `vllm serve`: a log line naming its engine, then /health
// on --host:--port until SIGTERM.
func fakeVLLM(arg func(string) string) int {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	ln, err := net.Listen("tcp", net.JoinHostPort(arg("--host"), arg("--port")))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go http.Serve(ln, http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	fmt.Fprintf(os.Stderr, "INFO fake vllm serving %s as %s\n", arg("--served-model-name"), arg("--kv-transfer-config"))
	<-sig
	return 0
}

func exists(path string) bool {
	if path == "" {
		return false
	}
	_, err := os.Stat(path)
	return err == nil
}

func fakeOptions(t *testing.T) Options {
	t.Helper()
	t.Setenv("LOCALCLUSTER_FAKE", "1")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	o := Defaults()
	o.Connexd, o.Sim = self, self
	o.Log = &testLog{t: t}
	o.StartTimeout = 20 * time.Second
	return o
}

// testLog sends lines to t.Log until the test ends.
type testLog struct {
	mu   sync.Mutex
	t    *testing.T
	done bool
}

func (l *testLog) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.done {
		l.t.Log(strings.TrimRight(string(b), "\n"))
	}
	return len(b), nil
}

// children lists the live processes whose parent is this test process.
func children(t *testing.T) []int {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	me := os.Getpid()
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		// pid (comm) state ppid …: comm may hold spaces, so split after ')'.
		f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(me) && f[0] != "Z" {
			pid, _ := strconv.Atoi(strings.Fields(string(b))[0])
			out = append(out, pid)
		}
	}
	return out
}

// procState is the one-letter state of pid ("S", "R", "T" for stopped, …).
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "gone"
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return f[0]
}

func needProc(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("needs /proc")
	}
}

func TestLocalFakeLifecycle(t *testing.T) {
	needProc(t)
	ctx := context.Background()
	c, err := Start(ctx, fakeOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	engines := c.Engines()
	var names []string
	for _, e := range engines {
		names = append(names, e.Name)
		if !strings.HasPrefix(e.URL, "http://127.0.0.1:") || e.EnginePID == 0 || e.ConnexdPID == 0 {
			t.Errorf("engine %+v", e)
		}
	}
	if strings.Join(names, ",") != "prefill-0,decode-0,decode-1" {
		t.Errorf("engines %q", names)
	}
	pids := c.PIDs()
	if len(pids) != 7 || len(children(t)) != 7 {
		t.Errorf("PIDs %v, children %v: want 7", pids, children(t))
	}
	if !strings.HasPrefix(c.RouterURL(), "http://127.0.0.1:") || !strings.HasPrefix(c.NATSURL(), "nats://127.0.0.1:") {
		t.Errorf("router %q nats %q", c.RouterURL(), c.NATSURL())
	}

	// Kill one process of a pair: the other lives.
	old, _ := c.PID("decode-1/engine")
	if err := c.Kill("decode-1/engine"); err != nil {
		t.Fatal(err)
	}
	if c.Running("decode-1/engine") || !c.Running("decode-1/connexd") || procState(old) != "gone" {
		t.Errorf("after Kill: engine running %v, connexd running %v, state %s",
			c.Running("decode-1/engine"), c.Running("decode-1/connexd"), procState(old))
	}
	if err := c.Kill("decode-1/engine"); err == nil {
		t.Error("Kill of a dead process: want an error")
	}
	if _, err := c.PID("decode-1"); err == nil {
		t.Error("PID of a pair: want an error")
	}
	// Restart both: new processes under the same name.
	oldConnexd, _ := c.PID("decode-1/connexd")
	if err := c.Restart(ctx, "decode-1"); err != nil {
		t.Fatal(err)
	}
	newEngine, _ := c.PID("decode-1/engine")
	newConnexd, _ := c.PID("decode-1/connexd")
	if newEngine == old || newConnexd == oldConnexd || !c.Running("decode-1") || procState(oldConnexd) != "gone" {
		t.Errorf("restart: engine %d→%d connexd %d→%d running %v", old, newEngine, oldConnexd, newConnexd, c.Running("decode-1"))
	}

	// Stop and Cont.
	pid, _ := c.PID("decode-0/connexd")
	if err := c.Stop("decode-0"); err != nil {
		t.Fatal(err)
	}
	waitState(t, pid, "T")
	if err := c.Cont("decode-0"); err != nil {
		t.Fatal(err)
	}
	waitState(t, pid, "S")

	// The router comes back on the same addresses.
	routerURL, natsURL := c.RouterURL(), c.NATSURL()
	if err := c.Restart(ctx, "router"); err != nil {
		t.Fatal(err)
	}
	if c.RouterURL() != routerURL || c.NATSURL() != natsURL {
		t.Errorf("router moved: %s %s → %s %s", routerURL, natsURL, c.RouterURL(), c.NATSURL())
	}
	if err := c.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}

	// An engine joins, one leaves.
	name, err := c.AddEngine(ctx, RoleDecode)
	if err != nil || name != "decode-2" || !c.Running("decode-2") {
		t.Fatalf("AddEngine = %q, %v", name, err)
	}
	if err := c.Term("prefill-0"); err != nil || c.Running("prefill-0/engine") || c.Running("prefill-0/connexd") {
		t.Errorf("Term: %v", err)
	}

	dir := c.Dir()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if kids := children(t); len(kids) != 0 {
		t.Errorf("processes left after Close: %v", kids)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("dir %s left: %v", dir, err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func waitState(t *testing.T, pid int, want string) {
	t.Helper()
	poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		if got := procState(pid); got != want {
			return fmt.Errorf("pid %d state %s, want %s", pid, got, want)
		}
		return nil
	})
}

func TestLocalFakeStartFailureReportsOutput(t *testing.T) {
	needProc(t)
	o := fakeOptions(t)
	t.Setenv("LOCALCLUSTER_FAKE_FAIL", "decode-1")
	c, err := Start(context.Background(), o)
	if err == nil {
		c.Close()
		t.Fatal("Start succeeded with a failing connexd")
	}
	if !strings.Contains(err.Error(), "decode-1/connexd exited before its ready line") || !strings.Contains(err.Error(), "boom: decode-1 cannot start") {
		t.Errorf("error does not name the process and its output: %v", err)
	}
	if kids := children(t); len(kids) != 0 {
		t.Errorf("processes left after a failed Start: %v", kids)
	}
}

func TestLocalFakeCloseKillsWhatIgnoresSIGTERM(t *testing.T) {
	needProc(t)
	o := fakeOptions(t)
	o.StopTimeout = 300 * time.Millisecond
	t.Setenv("LOCALCLUSTER_FAKE_STUBBORN", "decode-0")
	c, err := Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Close()
	if err == nil || !strings.Contains(err.Error(), "decode-0/") || !strings.Contains(err.Error(), "was killed") {
		t.Errorf("Close = %v, want decode-0 reported killed", err)
	}
	if kids := children(t); len(kids) != 0 {
		t.Errorf("processes left after Close: %v", kids)
	}
}
