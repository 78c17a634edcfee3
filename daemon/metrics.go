package daemon

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// promMetrics is connexd's Prometheus view (metrics_listen): the daemon's
// counters, live holds and requests, registered engines, and the pulls
// this member ran, observed from their PullDone notices.
type promMetrics struct {
	reg       *prometheus.Registry
	pulls     *prometheus.CounterVec
	pullBytes prometheus.Counter
	pullDur   prometheus.Histogram
	freed     *prometheus.CounterVec
	srv       *http.Server
	ln        net.Listener
}

func newPromMetrics(d *Daemon) *promMetrics {
	m := &promMetrics{
		reg: prometheus.NewRegistry(),
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_pulls_total",
			Help: "Pulls this member ran (decode side), by outcome: ok or the error name (timeout, peer_unavailable, expired, …)."}, []string{"outcome"}),
		pullBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "connex_pull_bytes_total",
			Help: "Bytes written by completed pulls."}),
		pullDur: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "connex_pull_duration_seconds",
			Help: "Duration of completed pulls, from pull.start to the last byte.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		freed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_holds_freed_total",
			Help: "Holds whose blocks went back to their engine, by reason (released, expired, pulled, shutdown, aborted)."}, []string{"reason"}),
	}
	counter := func(name, help string, v func(*actors.Metrics) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v(d.Metrics)) })
	}
	gauge := func(name, help string, v func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, v)
	}
	m.reg.MustRegister(m.pulls, m.pullBytes, m.pullDur, m.freed,
		counter("connex_holds_created_total", "Holds created on this member (prefill side).", func(x *actors.Metrics) int64 { return x.HoldsCreated.Load() }),
		counter("connex_double_frees_total", "Frees refused by block accounting; must stay 0.", func(x *actors.Metrics) int64 { return x.DoubleFrees.Load() }),
		counter("connex_pulls_abandoned_total", "Pulls of this member's holds whose reader never reported back.", func(x *actors.Metrics) int64 { return x.PullsAbandoned.Load() }),
		gauge("connex_holds_live", "Holds alive on this member now.", func() float64 { return float64(d.dir.Live()) }),
		gauge("connex_requests_in_flight", "Decode request actors hosted on this member now.", func() float64 { return float64(d.reqTable.Len()) }),
		gauge("connex_engines_registered", "Engines registered with this member now.", func() float64 {
			d.engMu.Lock()
			defer d.engMu.Unlock()
			live, _ := d.engines.reg.Live(d.now())
			return float64(len(live))
		}),
	)
	return m
}

// pullDone records a PullDone notice of this member's pull.
func (m *promMetrics) pullDone(p *messages.PullDone) {
	if p.GetOk() {
		m.pulls.WithLabelValues("ok").Inc()
		m.pullBytes.Add(float64(p.GetBytes()))
		m.pullDur.Observe((time.Duration(p.GetDurationUs()) * time.Microsecond).Seconds())
		return
	}
	m.pulls.WithLabelValues(api.Code(p.GetErrorCode()).Name()).Inc()
}

// blocksFreed records a BlocksFreed notice of this member's hold.
func (m *promMetrics) blocksFreed(b *messages.BlocksFreed) {
	m.freed.WithLabelValues(b.GetReason()).Inc()
}

// serve starts GET /metrics on addr.
func (m *promMetrics) serve(addr string, d *Daemon) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics_listen=%s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{}))
	m.ln, m.srv = ln, &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := m.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			d.log.Error("metrics HTTP server stopped", "err", err)
		}
	}()
	return nil
}

// URL is where /metrics is served ("" when off).
func (m *promMetrics) URL() string {
	if m == nil || m.ln == nil {
		return ""
	}
	return "http://" + m.ln.Addr().String() + "/metrics"
}

func (m *promMetrics) close() {
	if m != nil && m.srv != nil {
		_ = m.srv.Close()
	}
}
