package e2e

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/messages"
	"github.com/nats-io/nats-server/v2/server"
)

// TestNATSRestartIsSurvived stops the NATS server under a running connexd
// and starts a new one on the same port: connexd logs the loss, reconnects
// and serves the API again, with its holds intact.
func TestNATSRestartIsSurvived(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	start := func() *server.Server {
		srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoSigs: true, NoLog: true})
		if err != nil {
			t.Fatal(err)
		}
		go srv.Start()
		if !srv.ReadyForConnections(10 * time.Second) {
			t.Fatal("nats-server not ready")
		}
		return srv
	}
	srv := start()
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	pn := startConnexd(t, "survivor", "--backend", "tcp", "--nats-url", url)
	nc := connect(t, url)
	e := newEngine(t, nc, "survivor", "engS", testLayout, false)
	hold, err := e.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: e.id, RegionId: e.rid, BlockIds: []uint32{1, 2}})
	if err != nil {
		t.Fatal(err)
	}

	srv.Shutdown()
	srv.WaitForShutdown()
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if !strings.Contains(pn.logs(), "nats connection lost") {
			return fmt.Errorf("loss not logged yet")
		}
		return nil
	})
	srv = start()
	defer srv.Shutdown()
	checkFor(t, 15*time.Second, 50*time.Millisecond, func() error {
		st, err := e.cli.Inspect(ctx5(t), &messages.HoldRef{TransferId: hold.Params.TransferId})
		if err != nil {
			return err
		}
		if st.State != "held" {
			return fmt.Errorf("state %s", st.State)
		}
		return nil
	})
	if !pn.running() {
		t.Fatal("connexd exited on a lost NATS connection")
	}
	if !strings.Contains(pn.logs(), "nats connection recovered") {
		t.Fatalf("recovery not logged:\n%s", pn.logs())
	}
}
