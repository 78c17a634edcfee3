package simengine

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// Prefill kinds (connex_sim_prefills_total{kind}).
const (
	PrefillRemote    = "remote_prefill"               // the prefill leg of a P/D request
	PrefillLocal     = "local"                        // a request without kv_transfer_params
	PrefillRecompute = "recompute_after_load_failure" // a decode leg whose KV load failed, policy recompute
)

// metrics are the simulator's Prometheus series, on a registry of its own.
type metrics struct {
	reg              *prometheus.Registry
	prefills         *prometheus.CounterVec
	prefillTokens    prometheus.Counter
	kvLoads          *prometheus.CounterVec
	kvLoadedTokens   prometheus.Counter
	recomputedTokens prometheus.Counter
	resumes          prometheus.Counter
	requests         *prometheus.CounterVec
	fenced           prometheus.Counter
	tokenize         prometheus.Counter
}

func newMetrics(kv KV) *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		prefills: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_sim_prefills_total",
			Help: "Prefills of a prompt, whatever the reason (kind: remote_prefill, local, recompute_after_load_failure)."}, []string{"kind"}),
		prefillTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "connex_sim_prefill_tokens_total",
			Help: "Prompt tokens prefilled (all kinds)."}),
		kvLoads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_sim_kv_loads_total",
			Help: "KV loads of decode legs by outcome (ok, expired, released, holder_unavailable, corrupt, …)."}, []string{"outcome"}),
		kvLoadedTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "connex_sim_kv_loaded_tokens_total",
			Help: "Tokens of KV loaded by pulls: min(remote_num_tokens, tokens given) per load."}),
		recomputedTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "connex_sim_recomputed_tokens_total",
			Help: "Tokens after the loaded KV computed locally (the k generated tokens of a resume)."}),
		resumes: prometheus.NewCounter(prometheus.CounterOpts{Name: "connex_sim_resumes_total",
			Help: "Decode legs that resumed a request (connex_resume)."}),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_sim_requests_total",
			Help: "Requests by outcome (ok, bad_request, kv_load_failed, canceled, fenced, shutdown, error)."}, []string{"status"}),
		fenced: prometheus.NewCounter(prometheus.CounterOpts{Name: "connex_sim_fenced_total",
			Help: "Requests stopped because another activation took them over."}),
		tokenize: prometheus.NewCounter(prometheus.CounterOpts{Name: "connex_sim_tokenize_total",
			Help: "Prompts counted through POST /tokenize (the router counts a text prompt near the context limit before its prefill)."}),
	}
	for _, k := range []string{PrefillRemote, PrefillLocal, PrefillRecompute} {
		m.prefills.WithLabelValues(k)
	}
	m.kvLoads.WithLabelValues("ok")
	for _, s := range []string{"ok", "bad_request", "kv_load_failed", "canceled", "fenced", "shutdown", "error"} {
		m.requests.WithLabelValues(s)
	}
	m.reg.MustRegister(m.prefills, m.prefillTokens, m.kvLoads, m.kvLoadedTokens, m.recomputedTokens, m.resumes, m.requests, m.fenced, m.tokenize)
	m.reg.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "connex_sim_blocks_free", Help: "Free KV blocks of the engine's allocator."},
			func() float64 { f, _, _ := kv.Counts(); return float64(f) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "connex_sim_blocks_total", Help: "KV blocks of the engine's region."},
			func() float64 { _, t, _ := kv.Counts(); return float64(t) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "connex_sim_holds", Help: "Prefill holds whose blocks have not come back yet."},
			func() float64 { _, _, h := kv.Counts(); return float64(h) }),
	)
	return m
}

// outcomeLabel turns a load failure reason into a label value.
func outcomeLabel(reason string) string { return strings.ReplaceAll(reason, " ", "_") }
