package e2e

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// startNATS runs a real nats-server in the test process on a random port,
// for tests that kill connexd processes (which must not take NATS with them).
func startNATS(t testing.TB) string {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(srv.Shutdown)
	return srv.ClientURL()
}

// restartableNATS is a nats-server in the test process on a fixed port
// (and, with JetStream, a store) that survives restarts: Stop and Start
// again are a NATS restart as clients see it.
type restartableNATS struct {
	t         testing.TB
	port      int
	store     string
	jetstream bool
	srv       *server.Server
}

// newRestartableNATS starts one on a free port; the test's end stops it.
func newRestartableNATS(t testing.TB, jetstream bool) *restartableNATS {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := &restartableNATS{t: t, port: l.Addr().(*net.TCPAddr).Port, store: t.TempDir(), jetstream: jetstream}
	l.Close()
	n.Start()
	t.Cleanup(func() { n.srv.Shutdown() })
	return n
}

// URL is the server's client URL, the same across restarts.
func (n *restartableNATS) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

// Start starts the server (again) and waits until it accepts clients.
func (n *restartableNATS) Start() {
	n.t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: n.port, JetStream: n.jetstream, StoreDir: n.store, NoSigs: true, NoLog: true})
	if err != nil {
		n.t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		n.t.Fatal("nats-server not ready")
	}
	n.srv = srv
}

// Stop shuts the server down and waits until it has.
func (n *restartableNATS) Stop() {
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
}
