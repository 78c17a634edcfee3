//go:build unix

package tcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// TestFrozenHolderProcess freezes a real holder process with SIGSTOP, in the
// middle of a transfer and while idle: Gets time out at their deadline; after
// SIGCONT Gets work again; after SIGKILL they fail with ErrPeerGone.
func TestFrozenHolderProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a helper process")
	}
	checkNoLeaks(t)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	fields := strings.Fields(line)
	if len(fields) != 2 {
		t.Fatalf("helper said %q", line)
	}
	addr := []byte(fields[0])
	key, err := hex.DecodeString(fields[1])
	if err != nil {
		t.Fatal(err)
	}
	mem := helperMem()

	client := openBackend(t, Config{ChunkBytes: 1 << 20})
	ctx := context.Background()
	ep, err := client.Connect(ctx, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ep.Close()
	dst := make([]byte, len(mem))
	whole := []transport.GetOp{{RemoteKey: key, Dst: dst}}
	if err := ep.Get(ctx, whole); err != nil {
		t.Fatalf("get from live holder: %v", err)
	}
	if !bytes.Equal(dst, mem) {
		t.Fatalf("payload differs")
	}

	timedGet := func(what string, deadline time.Duration) {
		t.Helper()
		took, err := getWithin(t, ep, deadline, whole)
		wantErr(t, err, transport.ErrTimeout)
		t.Logf("%s: timed out after %v", what, took)
	}

	// Freeze while a transfer streams (the reader is likely decoding a
	// payload into dst at that moment).
	errc := make(chan error, 1)
	tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	start := time.Now()
	go func() { errc <- ep.Get(tctx, whole) }()
	e := ep.(*endpointRef).e
	checkFor(t, 5*time.Second, 20*time.Microsecond, func() error {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, c := range e.slots {
			if c != nil {
				c.mu.Lock()
				busy := c.current != nil
				c.mu.Unlock()
				if busy {
					return nil
				}
			}
		}
		return errors.New("no payload streaming yet")
	})
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	err = waitGet(t, tctx, errc)
	took := time.Since(start)
	cancel()
	if err == nil {
		t.Log("transfer finished before SIGSTOP took effect")
	} else {
		wantErr(t, err, transport.ErrTimeout)
		t.Logf("mid-transfer freeze: timed out after %v", took)
	}
	timedGet("frozen, idle connection", 200*time.Millisecond)
	timedGet("frozen again", 100*time.Millisecond)

	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	clear(dst)
	tctx, cancel = context.WithTimeout(ctx, 20*time.Second)
	err = ep.Get(tctx, whole)
	cancel()
	if err != nil {
		t.Fatalf("get after SIGCONT: %v", err)
	}
	if !bytes.Equal(dst, mem) {
		t.Fatalf("payload after SIGCONT differs")
	}

	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	tctx, cancel = context.WithTimeout(ctx, 5*time.Second)
	err = ep.Get(tctx, whole)
	cancel()
	wantErr(t, err, transport.ErrPeerGone)
}
