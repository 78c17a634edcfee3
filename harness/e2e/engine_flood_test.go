package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/natsbus"
	"github.com/nats-io/nats.go"
)

// TestEngineConnectionFloodLeavesOthersServed is issue 44's finding 1 on a
// real `make run` cluster: one engine's credential (decode-0's
// engine.creds) opens 10000 NATS connections to the router's embedded
// server, 16 at a time, as fast as it can. The server keeps at most
// nats_engine_connections of them; every other engine stays registered
// and completions through the router keep being served, during the flood
// and after it. Before the fix the flood lapsed every engine's
// registration (/ready 503 no_engine, completions 404).
func TestEngineConnectionFloodLeavesOthersServed(t *testing.T) {
	c := startProduct(t, nil)
	creds := filepath.Join(c.Dir(), "decode-0", "engine.creds")
	if _, err := os.Stat(creds); err != nil {
		t.Fatal(err)
	}
	total := envInt("CONNEX_FLOOD_CONNS", 10000)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Completions through the router while the flood runs: every one must
	// be answered.
	var served, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var load sync.WaitGroup
	load.Add(1)
	go func() {
		defer load.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			status, ans, err := postJSON(ctx, c.RouterURL()+"/v1/completions", map[string]any{
				"model": "connex-sim", "prompt": "served while one engine floods the server " + strconv.Itoa(i), "max_tokens": 4})
			if err != nil || status != 200 {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, fmt.Sprintf("status %d %v %v", status, ans, err))
			} else {
				served.Add(1)
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()

	// The flood: 16 workers open connections with the stolen credential
	// and keep whatever the server leaves open.
	var (
		mu       sync.Mutex
		open     []*nats.Conn
		refused  atomic.Int64
		attempts atomic.Int64
	)
	start := time.Now()
	var flood sync.WaitGroup
	for range 16 {
		flood.Add(1)
		go func() {
			defer flood.Done()
			for attempts.Add(1) <= int64(total) {
				nc, err := nats.Connect(c.NATSURL(), nats.UserCredentials(creds), nats.NoReconnect(),
					nats.Timeout(5*time.Second), nats.Name("flood"))
				if err != nil {
					refused.Add(1)
					continue
				}
				mu.Lock()
				open = append(open, nc)
				mu.Unlock()
			}
		}()
	}
	flood.Wait()
	floodTook := time.Since(start)
	defer func() {
		for _, nc := range open {
			nc.Close()
		}
	}()
	// The server closes what is over the limit as it learns of it.
	var alive int
	checkFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		alive = 0
		for _, nc := range open {
			if !nc.IsClosed() {
				alive++
			}
		}
		if alive > natsbus.DefaultEngineConnections {
			return fmt.Errorf("%d of the flood's connections still open, want at most nats_engine_connections (%d)", alive, natsbus.DefaultEngineConnections)
		}
		return nil
	})
	// Every engine is still registered, and the cluster serves.
	awaitStatus(t, 10*time.Second, c.RouterURL()+"/ready", 200)
	for range 5 {
		status, ans, err := postJSON(ctx, c.RouterURL()+"/v1/completions", map[string]any{
			"model": "connex-sim", "prompt": "served after the flood", "max_tokens": 4})
		if err != nil || status != 200 {
			t.Fatalf("a completion after the flood: %d %v %v", status, ans, err)
		}
	}
	close(stop)
	load.Wait()
	t.Logf("flood: %d connections tried in %s (%d refused at connect, %d accepted then closed, %d left open); %d completions served during it, %d failed",
		total, floodTook.Round(time.Millisecond), refused.Load(), len(open)-alive, alive, served.Load(), failed.Load())
	if failed.Load() > 0 {
		t.Fatalf("%d completions failed during the flood (first: %v)", failed.Load(), firstErr.Load())
	}
	if served.Load() == 0 {
		t.Fatal("no completion was served during the flood")
	}
	if ctx.Err() != nil {
		t.Fatal(errors.New("the flood outlasted the test's deadline"))
	}
}
