package daemon

import (
	"context"
	"log/slog"
	"time"

	"github.com/connex/connex/config"
	"github.com/connex/connex/requests"
	"github.com/nats-io/nats.go"
)

// storeStartWindow is how long connexd waits at start for the request
// bucket: a NATS cluster that starts with its members (after a power cut,
// say) takes seconds to elect a JetStream leader and learn its peers, and a
// member that gave up at once would run without the request API and
// cluster membership until restarted.
const storeStartWindow = 60 * time.Second

// openRequestStore opens the request bucket, trying again every second
// while the error is one the forming NATS cluster will cure (see
// requests.Unrecoverable), for up to storeStartWindow.
func openRequestStore(nc *nats.Conn, cfg config.Config, log *slog.Logger) (*requests.KVStore, error) {
	deadline := time.Now().Add(storeStartWindow)
	for attempt := 1; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		st, err := requests.OpenKVStore(ctx, nc, cfg.JSReplicas, cfg.RequestTTL, cfg.RequestStoreBytes)
		cancel()
		if err == nil {
			st.Log = log
			if attempt > 1 {
				log.Info("request bucket open", "attempts", attempt)
			}
			return st, nil
		}
		if requests.Unrecoverable(err) || time.Now().After(deadline) {
			return nil, err
		}
		log.Warn("request bucket not available yet; retrying (is the NATS cluster still forming, with as many JetStream servers as js_replicas?)",
			"err", err, "js_replicas", cfg.JSReplicas, "attempt", attempt)
		time.Sleep(time.Second)
	}
}
