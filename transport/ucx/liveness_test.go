//go:build ucx && cgo

package ucx

import (
	"errors"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// startSleeper starts a child process that lives until killed and returns
// its procID as a holder's key would name it.
func startSleeper(t *testing.T) (*exec.Cmd, procID) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	start, err := procStart(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	self, err := selfProc()
	if err != nil {
		t.Fatal(err)
	}
	return cmd, procID{pid: uint32(cmd.Process.Pid), start: start, host: self.host}
}

// waitGone polls l.check(p) until it reports ErrPeerGone.
func waitGone(t *testing.T, l *liveness, p procID) error {
	t.Helper()
	var err error
	checkFor(t, 5*time.Second, time.Millisecond, func() error {
		err = l.check(p)
		if err != nil && !errors.Is(err, transport.ErrPeerGone) {
			t.Fatalf("check: want nil or ErrPeerGone, got %v", err)
		}
		if err == nil {
			return fmt.Errorf("holder %d killed, still reported alive", p.pid)
		}
		return nil
	})
	return err
}

// TestLivenessWatchesWithPidfd: a live process is alive and watched
// through a pidfd; once killed it is gone, as a zombie (not yet reaped)
// and after it was reaped, and its pidfd is closed.
func TestLivenessWatchesWithPidfd(t *testing.T) {
	for _, reap := range []bool{false, true} {
		l := &liveness{fds: map[procID]int{}}
		cmd, p := startSleeper(t)
		if err := l.check(p); err != nil {
			t.Fatalf("live process: %v", err)
		}
		l.mu.RLock()
		_, watched := l.fds[p]
		l.mu.RUnlock()
		if !watched && !l.noPidfd {
			t.Fatal("live process checked but not watched through a pidfd")
		}
		if err := l.check(p); err != nil {
			t.Fatalf("second check (pidfd): %v", err)
		}
		if err := cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		if reap {
			_ = cmd.Wait()
		}
		err := waitGone(t, l, p)
		t.Logf("reaped=%v: %v", reap, err)
		l.mu.RLock()
		_, still := l.fds[p]
		l.mu.RUnlock()
		if still {
			t.Fatal("dead process's pidfd kept")
		}
	}
}

// TestLivenessRefusesAnotherProcess: a key naming a live pid with another
// start time (the pid was reused) is gone, and nothing is watched for it.
func TestLivenessRefusesAnotherProcess(t *testing.T) {
	l := &liveness{fds: map[procID]int{}}
	_, p := startSleeper(t)
	p.start++
	if err := l.check(p); !errors.Is(err, transport.ErrPeerGone) {
		t.Fatalf("reused pid: want ErrPeerGone, got %v", err)
	}
	if len(l.fds) != 0 {
		t.Fatalf("watching %d processes after a refused check", len(l.fds))
	}
}

// TestLivenessWithoutPidfd: where pidfds are unavailable, checks read
// /proc and still see a death.
func TestLivenessWithoutPidfd(t *testing.T) {
	l := &liveness{fds: map[procID]int{}, noPidfd: true}
	cmd, p := startSleeper(t)
	if err := l.check(p); err != nil {
		t.Fatalf("live process: %v", err)
	}
	if len(l.fds) != 0 {
		t.Fatal("watched a process without pidfds")
	}
	_ = cmd.Process.Kill()
	waitGone(t, l, p)
}

// BenchmarkCheckAlive compares a liveness check through /proc with one
// through a pidfd, on this (live) process.
func BenchmarkCheckAlive(b *testing.B) {
	self, err := selfProc()
	if err != nil {
		b.Fatal(err)
	}
	b.Run("proc", func(b *testing.B) {
		for b.Loop() {
			if err := statAlive(self); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("pidfd", func(b *testing.B) {
		l := &liveness{fds: map[procID]int{}}
		for b.Loop() {
			if err := l.check(self); err != nil {
				b.Fatal(err)
			}
		}
	})
}
