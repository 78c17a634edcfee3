//go:build ucx && cgo

package ucx

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// BenchmarkGetPastDeadline measures how long a Get takes to return after
// its context's deadline, the figure tests only bound by hangGuard: against
// a stalled holder (its owner thread paused; the reader cancels posted
// GETs by force-closing the endpoint), for each transport list, and for a
// onesided 256 MiB CMA copy (the reader stops between process_vm_readv
// calls). The metric is ms-past-deadline per Get.
//
//	go test -tags ucx -run '^$' -bench GetPastDeadline -benchtime 20x ./transport/ucx/
func BenchmarkGetPastDeadline(b *testing.B) {
	for _, tls := range tlsCases {
		b.Run("stalled/"+tlsName(tls), func(b *testing.B) {
			h, r := openT(b, tls), openT(b, tls)
			src := randBytes(1<<20, 21)
			reg, err := h.Register(src)
			if err != nil {
				b.Fatal(err)
			}
			ep := connectT(b, r, h)
			op := []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: make([]byte, len(src))}}
			if err := getT(ep, 5*time.Second, op); err != nil {
				b.Fatal(err)
			}
			resume := pauseHolder(b, h)
			benchPastDeadline(b, ep, 20*time.Millisecond, op)
			b.StopTimer()
			resume()
			// Let the endpoint wire up again before the backends close:
			// UCX 1.13 aborts in ucp_worker_destroy when it purges wire-up
			// messages still pending on a shared-memory endpoint.
			if err := getT(ep, 5*time.Second, op); err != nil {
				b.Fatal(err)
			}
		})
	}
	b.Run("onesided-cma-256MiB", func(b *testing.B) {
		h, r := openOneSided(b), openOneSided(b)
		src := randBytes(256<<20, 22)
		reg, err := h.Register(src)
		if err != nil {
			b.Fatal(err)
		}
		ep := connectT(b, r, h)
		op := []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: make([]byte, len(src))}}
		benchPastDeadline(b, ep, time.Millisecond, op)
	})
}

// benchPastDeadline runs b.N Gets with deadline d and reports how long
// each returned after it.
func benchPastDeadline(b *testing.B, ep transport.Endpoint, d time.Duration, op []transport.GetOp) {
	var past time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		dl, _ := ctx.Deadline()
		err := ep.Get(ctx, op)
		past += max(time.Since(dl), 0)
		cancel()
		if err != nil && !errors.Is(err, transport.ErrTimeout) {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(past.Microseconds())/1e3/float64(b.N), "ms-past-deadline")
}
