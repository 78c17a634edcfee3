package router

import (
	"slices"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Label values come only from bounded sets: a label taken from what a client
// or an engine wrote (a model name, an engine's error code) would let either
// grow the router's memory and /metrics without end, one series per value.

// labelOther stands for every value outside a label's bounded set.
const labelOther = "other"

// maxModelLabel bounds a model name used as a label (engines' served names
// are far shorter).
const maxModelLabel = 256

// modelLabel is model if some engine serves it (known), else "unknown".
func modelLabel(model string, known []string) string {
	if len(model) <= maxModelLabel && slices.Contains(known, model) {
		return model
	}
	return "unknown"
}

// codeLabel is code if it is one of routerCodes (codes_gen.go), else
// "other" (engines' codes are relayed to clients as they are, but not made
// into series).
func codeLabel(code string) string {
	if slices.Contains(routerCodes, code) {
		return code
	}
	return labelOther
}

// kvLoadLabel is an engine's connex.kv_load if it is one the router knows.
func kvLoadLabel(kind string) string {
	switch kind {
	case "pulled", "recomputed", "local":
		return kind
	}
	return labelOther
}

// statusLabel is an HTTP status as a label; an engine's status outside
// 100..599 is "other".
// statusClientClosed is the status label of a request whose client left
// before anything was answered (nginx's 499 "client closed request").
const statusClientClosed = 499

func statusLabel(status int) string {
	if status < 100 || status > 599 {
		return labelOther
	}
	return strconv.Itoa(status)
}

// metrics are the router's Prometheus series, served on its /metrics.
type metrics struct {
	reg          *prometheus.Registry
	requests     *prometheus.CounterVec
	inFlight     prometheus.Gauge
	prefills     *prometheus.CounterVec
	resumes      *prometheus.CounterVec
	falseResumes *prometheus.CounterVec
	refused      *prometheus.CounterVec
	replays      prometheus.Counter
	seeded       prometheus.Counter
	errors       *prometheus.CounterVec
	kvLoads      *prometheus.CounterVec
	ttft         prometheus.Histogram
	itl          prometheus.Histogram
	e2e          prometheus.Histogram
	resumeGap    prometheus.Histogram
	holdReleases *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_router_requests_total",
			Help: "Client requests by model, endpoint and final HTTP-like status (200, or the error's status)."}, []string{"model", "endpoint", "status"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{Name: "connex_router_requests_in_flight",
			Help: "Client requests being answered now."}),
		prefills: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_router_prefills_total",
			Help: "Prefill legs sent (one per request; a retry after a failed prefill leg counts again)."}, []string{"model"}),
		resumes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_router_resumes_total",
			Help: "Decode streams moved to another decode engine, by why: broken, stalled, engine_left, engine_error."}, []string{"reason"}),
		falseResumes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_router_false_resumes_total",
			Help: "Resumes whose old decode leg showed life after it was given up (a chunk or the end of its stream, or a 2xx answer to its health probe, before the resumed stream's first token: waiting would have been no slower): the cost of a false alarm, by the resume's reason (stalled, engine_left, broken, engine_error)."}, []string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_router_resumes_refused_total",
			Help: "Requests whose decode engine failed mid-request and that were ended with resume_refused instead of resumed into a different answer, by why: tools, reasoning, logprobs, seeded_sampling, output_penalties, bad_words (each for a request that samples without a seed, which a replay cannot resume: only with router_assign_seed off), diverged (a replay drew other tokens)."}, []string{"reason"}),
		replays: prometheus.NewCounter(prometheus.CounterOpts{Name: "connex_router_resume_replays_total",
			Help: "Resumes by replay: a request whose answer needs its whole generation (tools, a reasoning parser, logprobs, a seeded sampler, output penalties, bad_words), sent again and generated again from its first token on the resumed engine, the tokens the client has left out."}),
		seeded: prometheus.NewCounter(prometheus.CounterOpts{Name: "connex_router_seeds_assigned_total",
			Help: "Sampled requests the router gave a random seed of its own (router_assign_seed) because they resume only by replay (tools, a reasoning parser, logprobs, output penalties, bad_words), so that a replay draws the tokens the client has."}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_router_errors_total",
			Help: "Requests that ended with an error, by error code."}, []string{"code"}),
		kvLoads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_router_kv_loads_total",
			Help: "Decode legs by how the engine got the KV: pulled, recomputed (kv_load_failure_policy recompute: a local prefill), local."}, []string{"kv_load"}),
		ttft: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "connex_router_time_to_first_token_seconds",
			Help: "From the client's request to its first token.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
		itl: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "connex_router_inter_token_latency_seconds",
			Help: "Between consecutive tokens relayed to a client.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		e2e: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "connex_router_e2e_request_latency_seconds",
			Help: "From the client's request to the end of its answer.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 14)}),
		holdReleases: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "connex_router_hold_releases_total",
			Help: "Prefill holds the router released itself because their request ended without a decode engine taking it, by why the request ended (rejected: a decode engine refused it; failed: no decode engine could run it; client_gone: the client left first) and outcome (ok, or refused: a decode engine had bound the hold and frees it itself, or the hold had already ended)."}, []string{"reason", "outcome"}),
		resumeGap: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "connex_router_resume_gap_seconds",
			Help: "From a decode failure being detected to the next token relayed from the resumed stream.", Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
	}
	m.reg.MustRegister(m.requests, m.inFlight, m.prefills, m.resumes, m.falseResumes, m.refused, m.replays, m.seeded, m.errors, m.kvLoads, m.ttft, m.itl, m.e2e, m.resumeGap, m.holdReleases)
	return m
}
