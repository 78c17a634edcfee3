package daemon

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/connex/connex/actors"
	"github.com/connex/connex/api"
	"github.com/connex/connex/lease"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
	"github.com/connex/connex/transport"
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
	pullRead  prometheus.Histogram
	pullSize  prometheus.Histogram
	freed     *prometheus.CounterVec
	notices   *prometheus.CounterVec
	replays   prometheus.Counter
	departed  *prometheus.CounterVec
	failover  prometheus.Histogram
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
			Help: "Duration of completed pulls, from pull.start to the last byte.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
			ConstLabels: prometheus.Labels{"backend": d.Backend.Name()}}),
		pullRead: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "connex_pull_read_seconds",
			Help: "Data-plane read time of completed pulls (bytes over this is the transfer speed).", Buckets: prometheus.ExponentialBuckets(0.0002, 2, 17),
			ConstLabels: prometheus.Labels{"backend": d.Backend.Name()}}),
		pullSize: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "connex_pull_size_bytes",
			Help: "Bytes of completed pulls.", Buckets: prometheus.ExponentialBuckets(64<<10, 4, 10),
			ConstLabels: prometheus.Labels{"backend": d.Backend.Name()}}),
		freed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_holds_freed_total",
			Help: "Holds whose blocks went back to their engine, by reason (released, expired, pulled, shutdown, aborted)."}, []string{"reason"}),
		notices: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_notices_total",
			Help: "Notices published to engines, by kind (pull.done, blocks.freed, request.resume, request.fenced, hold.lost)."}, []string{"kind"}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{Name: "connex_notice_replays_total",
			Help: "engine.notices calls that returned missed notices (an engine caught up after a disconnect)."}),
		failover: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "connex_request_failover_seconds",
			Help: "From the coordinator seeing a request's owner leave to the request adopted here (cluster-resumed requests).", Buckets: prometheus.ExponentialBuckets(0.01, 2, 12)}),
		departed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_cluster_departures_total",
			Help: "Members that left this member's view, by reason (leave, unreachable, timeout, blocked, dead)."}, []string{"reason"}),
	}
	counter := func(name, help string, v func(*actors.Metrics) int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v(d.Metrics)) })
	}
	gauge := func(name, help string, v func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, v)
	}
	m.reg.MustRegister(m.pulls, m.pullBytes, m.pullDur, m.pullRead, m.pullSize, m.freed, m.notices, m.replays, m.departed, m.failover,
		counter("connex_lease_renewals_total", "Lease renewals of this member's holds (hold.renew).", func(x *actors.Metrics) int64 { return x.LeaseRenewals.Load() }),
		counter("connex_requests_taken_over_total", "Requests a router's resume moved to an engine of this member.", func(x *actors.Metrics) int64 { return x.TakenOver.Load() }),
		counter("connex_request_grants_moved_total", "Requests moved to an engine of this member when the router's grant arrived, ahead of the engine's takeover.", func(x *actors.Metrics) int64 { return x.GrantsMoved.Load() }),
		counter("connex_request_grants_lapsed_total", "Router grants whose engine never sent its takeover (a request moved ahead is deleted and its hold released).", func(x *actors.Metrics) int64 { return x.GrantsLapsed.Load() }),
		counter("connex_requests_adopted_total", "Requests of departed members adopted here.", func(x *actors.Metrics) int64 { return x.Adopted.Load() }),
		counter("connex_requests_fenced_total", "Request activations here told their request moved elsewhere.", func(x *actors.Metrics) int64 { return x.Fenced.Load() }),
		counter("connex_holds_lost_total", "Running requests here whose hold was gone (hold.lost notices).", func(x *actors.Metrics) int64 { return x.HoldsLost.Load() }),
		gauge("connex_pulls_in_flight", "Pulls this member runs now.", func() float64 { return float64(d.inflight.Len()) }),
		gauge("connex_hold_oldest_age_seconds", "Age of the oldest live hold on this member (0: none): a stranded hold shows here.", func() float64 {
			var oldest time.Time
			for _, e := range d.dir.All() {
				if oldest.IsZero() || e.Created.Before(oldest) {
					oldest = e.Created
				}
			}
			if oldest.IsZero() {
				return 0
			}
			return d.now().Sub(oldest).Seconds()
		}),
		holdsByState{d: d, desc: prometheus.NewDesc("connex_holds", "Live holds by lease state (held, releasing, expiring).", []string{"state"}, nil)},
		heldByEngine{d: d,
			blocks: prometheus.NewDesc("connex_held_blocks", "Blocks held by live holds, per engine.", []string{"engine"}, nil),
			bytes:  prometheus.NewDesc("connex_held_bytes", "Bytes held by live holds, per engine.", []string{"engine"}, nil)},
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "connex_nats_engine_conns_refused_total",
			Help: "Engine connections the embedded NATS server closed for being over nats_engine_connections (or engines' share of nats_max_connections)."},
			func() float64 { return float64(d.Bus.EngineConnsRefused()) }),
		requestQuota{q: d.requestAPI.quota,
			refused: prometheus.NewDesc("connex_request_quota_refused_total", "request.start and request.progress calls refused 429 by a request-store quota, by limit (requests: requests_max_per_engine; bytes: request_bytes_per_engine; member_bytes: half of request_store_bytes).", []string{"limit"}, nil)},
		gauge("connex_nats_reconnects", "Times this member's NATS connection reconnected since start.", func() float64 { return float64(d.Bus.Conn.Stats().Reconnects) }),
		membersByRole{d: d, desc: prometheus.NewDesc("connex_cluster_members", "Members in this member's view, by role.", []string{"role"}, nil)},
		counter("connex_holds_created_total", "Holds created on this member (prefill side).", func(x *actors.Metrics) int64 { return x.HoldsCreated.Load() }),
		counter("connex_double_frees_total", "Frees refused by block accounting; must stay 0.", func(x *actors.Metrics) int64 { return x.DoubleFrees.Load() }),
		counter("connex_holds_quarantined_total", "Ended holds whose registrations the data plane could not revoke: their blocks stay held for good; must stay 0.", func(x *actors.Metrics) int64 { return x.HoldsQuarantined.Load() }),
		counter("connex_pull_reservations_taken_total", "Reads reserved at request.start that the engine's pull.start took: pulls that did not wait for the holder's answer.", func(x *actors.Metrics) int64 { return x.ReservationsTaken.Load() }),
		counter("connex_pull_reservations_dropped_total", "Reads reserved at request.start that no pull took (its time passed, the request finished, the pull did not fit, connexd stopped); many against taken: engines that start requests they do not pull.", func(x *actors.Metrics) int64 { return x.ReservationsDropped.Load() }),
		counter("connex_pulls_abandoned_total", "Pulls of this member's holds whose reader never reported back.", func(x *actors.Metrics) int64 { return x.PullsAbandoned.Load() }),
		gauge("connex_holds_live", "Holds alive on this member now.", func() float64 { return float64(d.dir.Live()) }),
		gauge("connex_requests_in_flight", "Decode request actors hosted on this member now.", func() float64 { return float64(d.reqTable.Len()) }),
		gauge("connex_engines_registered", "Engines registered with this member now.", func() float64 {
			return float64(len(d.engineAPI.live()))
		}),
	)
	m.registerDataPlane(d.Backend)
	return m
}

// registerDataPlane exports the data plane's own counts (Caps.Counters) as
// connex_data_plane_<name>_total. A backend whose Caps promise counters its
// type lacks was refused when it was opened (transport.CheckCaps).
func (m *promMetrics) registerDataPlane(b transport.Backend) {
	if b == nil || !b.Caps().Counters {
		return
	}
	c, err := transport.Promised[transport.Counters](b, "Counters")
	if err != nil {
		return
	}
	for _, ct := range c.Counters() {
		value := ct.Value
		m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "connex_data_plane_" + ct.Name + "_total", Help: ct.Help},
			func() float64 { return float64(value()) }))
	}
}

// pullDone records a PullDone notice of this member's pull.
func (m *promMetrics) pullDone(p *messages.PullDone) {
	if p.GetOk() {
		m.pulls.WithLabelValues("ok").Inc()
		m.pullBytes.Add(float64(p.GetBytes()))
		m.pullDur.Observe((time.Duration(p.GetDurationUs()) * time.Microsecond).Seconds())
		m.pullRead.Observe((time.Duration(p.GetReadUs()) * time.Microsecond).Seconds())
		m.pullSize.Observe(float64(p.GetBytes()))
		return
	}
	m.pulls.WithLabelValues(api.Code(p.GetErrorCode()).Name()).Inc()
}

// notice records a published notice of kind.
func (m *promMetrics) notice(kind string) { m.notices.WithLabelValues(kind).Inc() }

// requestQuota reports the refusals of the request-store quotas (the
// label's values are the three limits: bounded).
type requestQuota struct {
	q       *requests.Quota
	refused *prometheus.Desc
}

func (c requestQuota) Describe(ch chan<- *prometheus.Desc) { ch <- c.refused }

func (c requestQuota) Collect(ch chan<- prometheus.Metric) {
	if c.q == nil {
		return
	}
	for limit, n := range c.q.Refused() {
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(n), limit)
	}
}

// heldByEngine reports the blocks and bytes of live holds per engine (the
// label's values are the registered engines: bounded).
type heldByEngine struct {
	d             *Daemon
	blocks, bytes *prometheus.Desc
}

func (c heldByEngine) Describe(ch chan<- *prometheus.Desc) { ch <- c.blocks; ch <- c.bytes }

func (c heldByEngine) Collect(ch chan<- prometheus.Metric) {
	blocks, bytes := map[string]int{}, map[string]uint64{}
	for _, e := range c.d.dir.All() {
		blocks[e.Engine] += e.Blocks
		bytes[e.Engine] += e.Bytes
	}
	for eng, n := range blocks {
		ch <- prometheus.MustNewConstMetric(c.blocks, prometheus.GaugeValue, float64(n), eng)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(bytes[eng]), eng)
	}
}

// holdsByState reports live holds by their lease state.
type holdsByState struct {
	d    *Daemon
	desc *prometheus.Desc
}

func (c holdsByState) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c holdsByState) Collect(ch chan<- prometheus.Metric) {
	n := map[lease.State]int{}
	for _, e := range c.d.dir.All() {
		n[lease.State(e.State.Load())]++
	}
	for st, k := range n {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(k), st.String())
	}
}

// membersByRole reports this member's cluster view by role.
type membersByRole struct {
	d    *Daemon
	desc *prometheus.Desc
}

func (c membersByRole) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c membersByRole) Collect(ch chan<- prometheus.Metric) {
	if c.d.cluster == nil {
		return
	}
	n := map[string]int{}
	for _, m := range c.d.cluster.Members() {
		n[string(m.Role)]++
	}
	for role, k := range n {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(k), role)
	}
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
