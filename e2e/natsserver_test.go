package e2e

import (
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
