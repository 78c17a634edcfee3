package netlab

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
)

func newLab(t *testing.T, n int) *Lab {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CONNEX_REQUIRE_DEPS") != "" { // CI installed every dependency: a skip would hide a broken step
			t.Fatalf("CONNEX_REQUIRE_DEPS is set and network-namespace hosts cannot be made: %v", err)
		}
		t.Skip(err)
	}
	l, err := New(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Error(err)
		}
	})
	return l
}

// listenGateway runs a TCP echo server in the test process, on the lab's
// gateway address, which every host reaches through the bridge.
func listenGateway(t *testing.T, l *Lab) net.Listener {
	t.Helper()
	return echoServer(t, l.Gateway()+":0")
}

// echoServer answers every connection on addr with what it reads, until
// the test ends.
func echoServer(t *testing.T, addr string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer c.Close(); _, _ = io.Copy(c, c) }()
		}
	}()
	return ln
}

// dialFrom reports whether a TCP connection from h to addr gets an echo
// within d.
func dialFrom(h *Host, addr string, d time.Duration) error {
	// bash's /dev/tcp: a connect and an echo, from inside the namespace.
	cmd := h.Command("timeout", d.String(), "bash", "-c", "exec 3<>/dev/tcp/"+strings.Replace(addr, ":", "/", 1)+"; echo hi >&3; head -c 2 <&3")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return errors.New(strings.TrimSpace(string(out)) + ": " + err.Error())
	}
	if string(out) != "hi" {
		return errors.New("echo answered " + string(out))
	}
	return nil
}

// TestLabHostsReachEachOtherAndFaultsCut: hosts have their own addresses
// and reach the test process across the bridge; a one-way drop, a port
// drop, isolation and a link down cut what they say, and Heal restores it.
func TestLabHostsReachEachOtherAndFaultsCut(t *testing.T) {
	l := newLab(t, 2)
	h1, h2 := l.Hosts[0], l.Hosts[1]
	out, err := h1.Command("ip", "-o", "-4", "addr", "show", "dev", "eth0").Output()
	if err != nil || !strings.Contains(string(out), h1.IP+"/24") {
		t.Fatalf("h1's address: %q %v", out, err)
	}
	if out, err := h2.Command("ip", "-o", "link", "show").Output(); err != nil || strings.Contains(string(out), l.bridge) {
		t.Fatalf("h2 sees the root namespace's interfaces: %q %v", out, err)
	}
	echo := listenGateway(t, l).Addr().String()
	for _, h := range l.Hosts {
		if err := dialFrom(h, echo, 5*time.Second); err != nil {
			t.Fatalf("%s to the gateway: %v", h.Name, err)
		}
	}
	// The gateway is not a lab host: drop by port to cut it.
	if err := h1.AddDrop(Drop{Port: netPort(t, echo)}); err != nil {
		t.Fatal(err)
	}
	if err := dialFrom(h1, echo, time.Second); err == nil {
		t.Fatal("h1 reached a port it drops")
	}
	if n, err := h1.Dropped(); err != nil || n == 0 {
		t.Fatalf("h1's drop counters after a cut dial: %d %v", n, err)
	}
	if err := dialFrom(h2, echo, 5*time.Second); err != nil {
		t.Fatalf("h2, which drops nothing: %v", err)
	}
	if err := h1.Heal(); err != nil {
		t.Fatal(err)
	}
	if err := dialFrom(h1, echo, 5*time.Second); err != nil {
		t.Fatalf("h1 after Heal: %v", err)
	}
	if err := h1.LinkDown(); err != nil {
		t.Fatal(err)
	}
	if err := dialFrom(h1, echo, time.Second); err == nil {
		t.Fatal("h1 reached the gateway with its link down")
	}
	if err := h1.Heal(); err != nil {
		t.Fatal(err)
	}
	if err := dialFrom(h1, echo, 5*time.Second); err != nil {
		t.Fatalf("h1 after its link came back: %v", err)
	}
	// Host to host: an echo server on h2 (Python: nc is not everywhere).
	srv := h2.Command("python3", "-c", "import socket;s=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1);s.bind(('"+h2.IP+"',7007));s.listen(8)\nwhile True:\n c,_=s.accept();c.sendall(c.recv(16)[:2]);c.close()")
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Process.Kill(); _ = srv.Wait() })
	waitReach(t, h1, h2.Addr(7007))
	if err := h2.Isolate(); err != nil {
		t.Fatal(err)
	}
	if err := dialFrom(h1, h2.Addr(7007), time.Second); err == nil {
		t.Fatal("h1 reached an isolated host")
	}
	if err := h2.Heal(); err != nil {
		t.Fatal(err)
	}
	waitReach(t, h1, h2.Addr(7007))
	// One-way: h1 drops what it sends to h2; h2's packets still reach h1,
	// but no connection completes.
	if err := h1.AddDrop(Drop{To: h2}); err != nil {
		t.Fatal(err)
	}
	if err := dialFrom(h1, h2.Addr(7007), time.Second); err == nil {
		t.Fatal("h1 reached h2 while dropping what it sends it")
	}
}

func waitReach(t *testing.T, h *Host, addr string) {
	t.Helper()
	poll.Until(t, 10*time.Second, 50*time.Millisecond, func() error {
		if err := dialFrom(h, addr, 2*time.Second); err != nil {
			return fmt.Errorf("%s cannot reach %s: %w", h.Name, addr, err)
		}
		return nil
	})
}

func netPort(t *testing.T, addr string) int {
	t.Helper()
	p := Port(addr)
	if p == 0 {
		t.Fatalf("no port in %q", addr)
	}
	return p
}

func TestDropRules(t *testing.T) {
	h := &Host{IP: "10.0.0.2"}
	for _, c := range []struct {
		d    Drop
		want string
	}{
		{Drop{}, "counter drop"},
		{Drop{To: h, Percent: 5}, "ip daddr 10.0.0.2 numgen random mod 100 < 5 counter drop"},
		{Drop{Port: 80}, "tcp dport 80 counter drop|tcp sport 80 counter drop"},
	} {
		got, err := c.d.rules()
		if err != nil || strings.Join(got, "|") != c.want {
			t.Errorf("%+v: %q %v, want %q", c.d, got, err, c.want)
		}
	}
	for _, bad := range []Drop{{Percent: 101}, {Percent: -1}, {Port: 70000}} {
		if _, err := bad.rules(); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
