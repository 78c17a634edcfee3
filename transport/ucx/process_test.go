//go:build ucx && cgo

package ucx

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// Peer-death tests run the holder in a child process (this test binary,
// re-executed with holderEnv set) and freeze or kill it mid-pull.

const (
	holderEnv  = "CONNEX_UCX_TEST_HOLDER"
	readsEnv   = "CONNEX_UCX_TEST_READS"
	holderSize = 64 << 20
	holderSeed = 42
)

func TestMain(m *testing.M) {
	if os.Getenv(holderEnv) != "" {
		os.Exit(runHolder())
	}
	os.Exit(m.Run())
}

// runHolder registers holderSize random bytes, prints "addr key base", and
// serves until its stdin closes.
// With readsEnv=shared the bytes live in memory from Allocate (a shared
// key).
func runHolder() int {
	reads := os.Getenv(readsEnv)
	b, err := OpenConfig(transport.Options{}, Config{Reads: strings.TrimPrefix(reads, "shared")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer b.Close()
	mem := randBytes(holderSize, holderSeed)
	if reads == "shared" {
		a, err := b.Allocate(holderSize)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		copy(a.Bytes(), mem)
		mem = a.Bytes()
	}
	reg, err := b.Register(mem)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("%x %x %d\n", b.Address(), reg.RemoteKey(), reg.RemoteAddr())
	// "read <addr> <key> <base> <n>" on stdin: read the parent's
	// registration over and over (a reader of the parent's memory as well).
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 5 && f[0] == "read" {
			go readForever(b, f[1:])
		}
	}
	return 0
}

func readForever(b *Backend, f []string) {
	addr, _ := hex.DecodeString(f[0])
	key, _ := hex.DecodeString(f[1])
	base, _ := strconv.ParseUint(f[2], 10, 64)
	n, _ := strconv.Atoi(f[3])
	ep, err := b.Connect(context.Background(), addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return
	}
	dst := make([]byte, n)
	for {
		_ = getT(ep, 10*time.Second, []transport.GetOp{{RemoteKey: key, RemoteAddr: base, Dst: dst}})
	}
}

type holderProc struct {
	cmd        *exec.Cmd
	addr, key  []byte
	base       uint64
	stdin      io.Writer
	stdinClose func()
}

func startHolder(t *testing.T, tls string) *holderProc {
	t.Helper()
	return startHolderReads(t, tls, "")
}

// startHolderReads starts a holder process whose Backend has Config.Reads
// reads.
func startHolderReads(t *testing.T, tls, reads string) *holderProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	env := []string{holderEnv + "=1", readsEnv + "=" + reads}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "UCX_TLS=") {
			env = append(env, e)
		}
	}
	if tls != "" {
		env = append(env, "UCX_TLS="+tls)
	}
	cmd.Env = env
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &holderProc{cmd: cmd, stdin: stdin, stdinClose: func() { stdin.Close() }}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGCONT)
		cmd.Process.Kill()
		cmd.Wait()
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
	}()
	var s string
	select {
	case s = <-line:
	case <-time.After(20 * time.Second):
		t.Fatal("holder process did not start")
	}
	f := strings.Fields(s)
	if len(f) != 3 {
		t.Fatalf("holder printed %q", s)
	}
	h.addr, _ = hex.DecodeString(f[0])
	h.key, _ = hex.DecodeString(f[1])
	h.base, _ = strconv.ParseUint(f[2], 10, 64)
	return h
}

// connectHolder connects r to h and checks one GET byte by byte.
func connectHolder(t *testing.T, r *Backend, h *holderProc) (transport.Endpoint, []transport.GetOp) {
	t.Helper()
	ep, err := r.Connect(context.Background(), h.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ep.Close() })
	want := randBytes(holderSize, holderSeed)
	dst := make([]byte, holderSize)
	ops := []transport.GetOp{{RemoteKey: h.key, RemoteAddr: h.base, Dst: dst}}
	if err := getT(ep, 10*time.Second, ops); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(dst, want) {
		t.Fatal("bytes from the holder process differ")
	}
	return ep, ops
}

func TestHolderProcessStopped(t *testing.T) {
	for _, tls := range tlsCases {
		t.Run(tlsName(tls), func(t *testing.T) {
			h := startHolder(t, tls)
			r := openT(t, tls)
			ep, ops := connectHolder(t, r, h)
			if err := h.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			const deadline = 500 * time.Millisecond
			took, err := getWithin(t, ep, deadline, ops)
			t.Logf("SIGSTOPped holder (tls %s): %v after %v", tlsName(tls), err, took)
			if !errors.Is(err, transport.ErrTimeout) {
				t.Fatalf("got %v, want ErrTimeout", err)
			}
		})
	}
}

func TestHolderProcessKilled(t *testing.T) {
	for _, tls := range tlsCases {
		t.Run(tlsName(tls), func(t *testing.T) {
			h := startHolder(t, tls)
			r := openT(t, tls)
			ep, ops := connectHolder(t, r, h)
			// Pull repeatedly; kill the holder while a pull is posted.
			const deadline = time.Second
			killWhile(h, func() bool { return postedBatches(r) > 0 })
			pullFromKilled(t, ep, ops, deadline, 100, nil, fmt.Sprintf("SIGKILLed holder (tls %s)", tlsName(tls)))
		})
	}
}

// Peer death in onesided mode. The reader copies with process_vm_readv, so:
// a SIGKILLed holder fails the Get with ErrPeerGone (ESRCH, or a pid that
// no longer names the holder) as soon as the kernel tears it down; a
// SIGSTOPped holder's memory stays readable, so the Get completes with the
// right bytes without its CPU (liveness of a frozen holder is the lease's
// and the cluster's business, not the data plane's).

func TestOneSidedHolderProcessKilled(t *testing.T) {
	for _, viaUCX := range []bool{false, true} {
		t.Run(map[bool]string{false: "cma", true: "ucp_get_nbx"}[viaUCX], func(t *testing.T) {
			h := startHolderReads(t, "", ReadsOneSided)
			r := openOneSided(t)
			ep, ops := connectHolder(t, r, h)
			ep.(*Endpoint).e.noCMA.Store(viaUCX)
			const deadline = time.Second
			// Kill while a pull runs: posted to UCX, or (CMA, which
			// has no batch to see) inside Get.
			var inGet atomic.Bool
			running := inGet.Load
			if viaUCX {
				running = func() bool { return postedBatches(r) > 0 }
			}
			killWhile(h, running)
			pullFromKilled(t, ep, ops, deadline, 200, &inGet, fmt.Sprintf("SIGKILLed onesided holder (%s)", map[bool]string{false: "cma", true: "ucp_get_nbx"}[viaUCX]))
		})
	}
}

func TestOneSidedHolderProcessStopped(t *testing.T) {
	for _, viaUCX := range []bool{false, true} {
		name := map[bool]string{false: "cma", true: "ucp_get_nbx"}[viaUCX]
		t.Run(name, func(t *testing.T) {
			h := startHolderReads(t, "", ReadsOneSided)
			r := openOneSided(t)
			ep, ops := connectHolder(t, r, h)
			ep.(*Endpoint).e.noCMA.Store(viaUCX)
			if err := h.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			clear(ops[0].Dst)
			const deadline = 500 * time.Millisecond
			took, err := getWithin(t, ep, deadline, ops)
			t.Logf("SIGSTOPped onesided holder (%s): %v after %v", name, err, took)
			if viaUCX {
				// Emulated GETs need the holder's CPU.
				if !errors.Is(err, transport.ErrTimeout) {
					t.Fatalf("got %v, want ErrTimeout", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("CMA read of a stopped holder: %v", err)
			}
			if !bytes.Equal(ops[0].Dst, randBytes(holderSize, holderSeed)) {
				t.Fatal("bytes from the stopped holder differ")
			}
		})
	}
}

// Peer death with shared keys (memory from Allocate, read one-sided through
// the segment UCX mapped into the reader). The segment stays readable after
// the holder died, so the reader checks the holder process before and after
// each Get: a SIGKILLed holder fails the Get with ErrPeerGone instead of
// returning bytes whose hold died with it. A SIGSTOPped holder's memory is
// read without its CPU.

func TestSharedHolderProcessKilled(t *testing.T) {
	h := startHolderReads(t, "", "shared")
	r := openT(t, "")
	ep, ops := connectHolder(t, r, h)
	if !ep.(*Endpoint).e.shared.Load() {
		t.Fatal("the holder's key is not a shared key")
	}
	if err := h.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Not reaped: the holder stays a zombie, which counts as gone once its
	// last thread has exited (its pidfd polls readable then; liveness.go),
	// within milliseconds of the signal. Until then a Get may still
	// succeed, reading the memory as the holder left it.
	const deadline = time.Second
	t0 := time.Now()
	var err error
	checkFor(t, 2*time.Second, time.Millisecond, func() error {
		if err = getT(ep, deadline, ops); err == nil {
			return errors.New("Gets from the killed holder still succeed")
		}
		if !errors.Is(err, transport.ErrPeerGone) {
			t.Fatalf("Get from the killed holder: %v, want ErrPeerGone", err)
		}
		return nil
	})
	t.Logf("SIGKILLed shared holder: %v, %v after the signal", err, time.Since(t0))
	if _, st, err := procStat(h.cmd.Process.Pid); err != nil || st != 'Z' {
		t.Fatalf("the killed holder is not a zombie: state %q, %v", st, err)
	}
	h.cmd.Wait()
	if err := getT(ep, deadline, ops); !errors.Is(err, transport.ErrPeerGone) {
		t.Fatalf("after the holder was reaped: %v, want ErrPeerGone", err)
	}
}

func TestSharedHolderProcessStopped(t *testing.T) {
	h := startHolderReads(t, "", "shared")
	r := openT(t, "")
	ep, ops := connectHolder(t, r, h)
	if err := h.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	clear(ops[0].Dst)
	const deadline = 500 * time.Millisecond
	t0 := time.Now()
	err := getT(ep, deadline, ops)
	t.Logf("SIGSTOPped shared holder: %v after %v", err, time.Since(t0))
	if err != nil {
		t.Fatalf("one-sided read of a stopped holder: %v", err)
	}
	if !bytes.Equal(ops[0].Dst, randBytes(holderSize, holderSeed)) {
		t.Fatal("bytes from the stopped holder differ")
	}
}

// killWhile SIGKILLs h's process, from another goroutine, as soon as
// running reports a pull in progress (or after 5 s without one: the pulls
// then fail on the dead holder anyway).
func killWhile(h *holderProc, running func() bool) {
	go func() {
		waitUntil(5*time.Second, 100*time.Microsecond, running)
		h.cmd.Process.Signal(syscall.SIGKILL)
	}()
}

// TestStalledReaderOfOursIsAlsoOurHolder: a peer that reads this process's
// memory and is read by it freezes mid-read (SIGSTOP), so this process's
// replies to it never complete; a Deregister then force-closes their
// endpoint after DeregisterGrace. UCX may have matched the peer's
// connection to the endpoint this process reads it through: the process
// must survive it (the endpoint closed as its own, never closed twice),
// its Get to the peer must fail rather than hang, and a later Close of that
// endpoint must not touch what UCX freed.
func TestStalledReaderOfOursIsAlsoOurHolder(t *testing.T) {
	p := openT(t, "")
	mem := randBytes(holderSize, 7)
	reg, err := p.Register(mem)
	if err != nil {
		t.Fatal(err)
	}
	h := startHolder(t, "")
	ep, ops := connectHolder(t, p, h)
	fmt.Fprintf(h.stdin, "read %x %x %d %d\n", p.Address(), reg.RemoteKey(), reg.RemoteAddr(), len(mem))
	inflight := func() (n int64) {
		if err := p.w.call(func() { n = int64(p.w.c.replies) }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Freeze the peer with replies in flight (between two of its Gets
	// there are none: then let it go on and try again).
	deadline := time.Now().Add(20 * time.Second)
	for {
		for inflight() == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the peer never read this process's memory")
			}
			runtime.Gosched()
		}
		if err := h.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		if inflight() > 0 {
			break
		}
		if err := h.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	err = reg.Deregister()
	t.Logf("Deregister with a frozen reader: %v after %v", err, time.Since(t0).Round(time.Millisecond))
	if n := forcedDeregs(p); n != 1 {
		t.Fatalf("%d forced deregistrations, want 1: the frozen reader's replies were not force-closed", n)
	}
	err = getT(ep, 3*time.Second, ops)
	if err == nil {
		t.Fatal("a Get from the frozen peer succeeded")
	}
	t.Logf("Get from the frozen peer: %v", err)
	if err := ep.Close(); err != nil {
		t.Logf("Close: %v", err)
	}
}
