package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/messages"
)

// TestNATSRestartIsSurvived stops the NATS server under a running connexd
// and starts a new one on the same port: connexd logs the loss, reconnects
// and serves the API again, with its holds intact.
func TestNATSRestartIsSurvived(t *testing.T) {
	ns := newRestartableNATS(t, false)
	url := ns.URL()
	pn := startConnexd(t, "survivor", "--backend", "tcp", "--nats-url", url)
	nc := connect(t, url)
	e := newEngine(t, nc, "survivor", "engS", testLayout, false)
	hold, err := e.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: e.id, RegionId: e.rid, BlockIds: []uint32{1, 2}})
	if err != nil {
		t.Fatal(err)
	}

	ns.Stop()
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		if !strings.Contains(pn.logs(), "nats connection lost") {
			return fmt.Errorf("loss not logged yet")
		}
		return nil
	})
	ns.Start()
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
