package e2e

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport/tcp"
)

// TestIdleDataPlaneConnectionsRefuseNoPull: a hostile client on another
// address (127.0.0.2) opens 1100 connections to the holder's TCP data plane
// (more than its 1024 slots) and sends nothing; a pull from the decode-side
// connexd (127.0.0.1) still moves every byte at once. The attacker gets at
// most its per-peer share (64) and its silent connections are closed after
// the hello timeout.
func TestIdleDataPlaneConnectionsRefuseNoPull(t *testing.T) {
	pre, dec, pn, _ := cluster2(t, "tcp")
	if pn.dataAddr == "" {
		t.Fatal("the holder's ready line names no data address")
	}
	attacker := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 2 * time.Second}
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range 1100 {
		c, err := attacker.Dial("tcp", pn.dataAddr)
		if err != nil {
			continue // refused at the kernel's backlog: also fine
		}
		conns = append(conns, c)
	}
	// The holder closes what is over the attacker's share at once: wait
	// until at most 64 of its connections remain open.
	checkFor(t, 15*time.Second, 50*time.Millisecond, func() error {
		open := 0
		for _, c := range conns {
			if stillOpen(c) {
				open++
			}
		}
		if open > 64 {
			return fmt.Errorf("%d of the attacker's %d connections still open", open, len(conns))
		}
		return nil
	})
	h, err := pre.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pre.id, RegionId: pre.rid, BlockIds: []uint32{3, 4, 5}, NumTokens: 48})
	if err != nil {
		t.Fatal(err)
	}
	done := subscribe(t, dec.cli.NC, api.PullDoneSubject(dec.cli.Member, dec.id), func() *messages.PullDone { return new(messages.PullDone) })
	if _, err := dec.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: h.Params, EngineId: dec.id, RegionId: dec.rid, BlockIds: []uint32{6, 7, 8}, PullId: "under-attack"}); err != nil {
		t.Fatal(err)
	}
	if d := done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == "under-attack" }); !d.Ok {
		t.Fatalf("a pull while idle connections are open: %s (%d)", d.Error, d.ErrorCode)
	}
	verifyBlocks(t, pre.region, dec.region, []uint32{3, 4, 5}, []uint32{6, 7, 8}, nil)
	// The silent ones go after the hello timeout (10 s).
	checkFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		for _, c := range conns {
			if stillOpen(c) {
				return fmt.Errorf("an attacker's silent connection is still open")
			}
		}
		return nil
	})
}

// stillOpen reports whether the server has not closed c (a short read
// times out rather than returning EOF or a reset).
func stillOpen(c net.Conn) bool {
	_ = c.SetReadDeadline(time.Now().Add(time.Millisecond))
	var b [64]byte
	for {
		_, err := c.Read(b[:])
		if err == nil {
			continue
		}
		ne, ok := err.(net.Error)
		return ok && ne.Timeout()
	}
}

// TestDataPlaneSlotsFromStrangers (issue 29, finding 10): 1024 connections
// from 16 loopback addresses (64 each, every per-peer and the whole cap),
// each sending the data plane's plaintext hello as a stranger holding no
// credential would, and then nothing, filled the holder's slots and every
// pull from it failed. With auth on (the default) data_tls is on with the
// members' credentials: the strangers never finish a handshake, take no
// served slot, and the pull moves every byte.
func TestDataPlaneSlotsFromStrangers(t *testing.T) {
	pre, dec, pn, _ := cluster2(t, "tcp")
	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	hello := append([]byte("CNXT"), tcp.ProtocolVersion, 0, 0, 0) // the data plane's hello, in plaintext
	for ip := range 16 {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(1+ip))}, Timeout: 2 * time.Second}
		for range 64 {
			c, err := d.Dial("tcp", pn.dataAddr)
			if err != nil {
				continue // refused at the kernel's backlog: also fine
			}
			_, _ = c.Write(hello)
			conns = append(conns, c)
		}
	}
	h, err := pre.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pre.id, RegionId: pre.rid, BlockIds: []uint32{3, 4, 5}, NumTokens: 48})
	if err != nil {
		t.Fatal(err)
	}
	done := subscribe(t, dec.cli.NC, api.PullDoneSubject(dec.cli.Member, dec.id), func() *messages.PullDone { return new(messages.PullDone) })
	if _, err := dec.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: h.Params, EngineId: dec.id, RegionId: dec.rid, BlockIds: []uint32{6, 7, 8}, PullId: "strangers"}); err != nil {
		t.Fatal(err)
	}
	if d := done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == "strangers" }); !d.Ok {
		t.Fatalf("a pull while strangers hold every slot: %s (%d)", d.Error, d.ErrorCode)
	}
	verifyBlocks(t, pre.region, dec.region, []uint32{3, 4, 5}, []uint32{6, 7, 8}, nil)
}
