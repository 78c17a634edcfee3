package tcp

import (
	"context"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// BenchmarkGetPastDeadline measures how long a Get takes to return after
// its context's deadline against a peer that accepts and never answers,
// the figure tests only bound by hangGuard. The metric is
// ms-past-deadline per Get.
//
//	go test -run '^$' -bench GetPastDeadline -benchtime 20x ./transport/tcp/
func BenchmarkGetPastDeadline(b *testing.B) {
	peer := newSilentPeer(b)
	client := openBackend(b, Config{})
	ep, err := client.Connect(context.Background(), peer.addr())
	if err != nil {
		b.Fatal(err)
	}
	defer ep.Close()
	op := []transport.GetOp{{RemoteKey: anyKey, Dst: make([]byte, 1<<20)}}
	var past time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		dl, _ := ctx.Deadline()
		err := ep.Get(ctx, op)
		past += max(time.Since(dl), 0)
		cancel()
		wantErr(b, err, transport.ErrTimeout)
	}
	b.ReportMetric(float64(past.Microseconds())/1e3/float64(b.N), "ms-past-deadline")
}
