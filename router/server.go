package router

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/connex/connex/clock"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Config is what a router needs; connexd fills it from its configuration.
type Config struct {
	// Listen is the HTTP address (http_listen).
	Listen string
	// Engines returns the engines membership advertises now. Engines of
	// suspect members are included with Suspect set; Pick chooses one only
	// when no engine of an unsuspected member qualifies. The router only
	// reads the slice and its engines, so a source may hand every call the
	// same one until membership changes (connexd does).
	Engines func() []Engine
	// Stall is when a silent decode leg is suspected and given up (see
	// StallRule; its zero value: DefaultStallRule).
	Stall StallRule
	// Clock is the router's time: request and token times, the stall and
	// membership timers, a retired leg's watch (nil: the system clock).
	Clock clock.Clock
	// PrefillTimeout bounds the prefill leg.
	PrefillTimeout time.Duration
	// MaxResumes bounds how often one request moves to another decode engine.
	MaxResumes int
	// NoAssignSeed turns off the seed the router gives a sampled request
	// that resumes only by replay (seed.go): such a request is then ended
	// with resume_refused when its decode engine fails (router_assign_seed
	// off).
	NoAssignSeed bool
	// MaxBodyBytes bounds a client body.
	MaxBodyBytes int64
	// ReadHeaderTimeout, ReadTimeout and IdleTimeout bound how long a
	// client may take to send its headers, its whole request, and how long
	// an idle keep-alive connection stays open (zero: the Default*
	// constants). A streamed answer has no write deadline.
	ReadHeaderTimeout, ReadTimeout, IdleTimeout time.Duration
	// MaxConns caps open client connections (0: DefaultMaxConns).
	MaxConns int
	// APIKeys, if any, are required on /v1/* ("Authorization: Bearer
	// <key>"); without one a request is answered 401 invalid_api_key.
	APIKeys []string
	// AdminKeys, if any, are required on the operator endpoints
	// (/connex/v1/*, /metrics). Engines' base URLs are listed only to a
	// caller that presents one: without admin keys they are never listed.
	AdminKeys []string
	// MaxInFlight caps completions served at once; one more is answered
	// 503 overloaded with Retry-After (0: DefaultMaxInFlight).
	MaxInFlight int
	// Authorize, if set, gives the router's word that engine e may take
	// request requestID over, before a resumed leg is sent to it (connexd:
	// peer.grant to e's member; an engine's takeover needs it). An engine
	// it fails for is skipped.
	Authorize func(ctx context.Context, e Engine, requestID string) error
	// ReleaseHold, if set, releases the prefill hold that kv_transfer_params
	// name (connexd: hold.release on the holder's member, for request
	// requestID). The router calls it when a request ends without an
	// answer, so that a request no decode engine took up costs its prefill
	// engine nothing more; a hold a decode engine has bound refuses it (that
	// engine's request frees it) and the error says so.
	ReleaseHold func(ctx context.Context, params json.RawMessage, requestID string) error
	// Busy, if set, is called as each completion is admitted, and the
	// func it returns as that completion ends (connexd: the member has
	// work in hand and heartbeats at the full rate meanwhile). Both must be
	// quick.
	Busy func() (done func())
	// Log gets one line per request event worth an operator's attention.
	Log *slog.Logger
}

// Server is a running router.
type Server struct {
	cfg     Config
	log     *slog.Logger
	ln      net.Listener
	srv     *http.Server
	client  *http.Client // the engines' tokenizers; the legs' fallback
	up      *upstream    // the legs
	metrics *metrics
	admit   *admission
	// apiKeys guard /v1/*, adminKeys the operator endpoints.
	apiKeys, adminKeys *keyring
	clock              clock.Clock

	mu   sync.Mutex
	busy map[string]int // legs this router has running per engine id
	// heard is when each engine last showed life on any of this router's
	// legs (a token, an answered health probe): evidence for its other
	// legs' stall checks.
	heard map[string]time.Time
	done  chan struct{}
	// readerRelays counts the chunks the legs' readers relayed themselves
	// (legShare), for the tests that pin that path.
	readerRelays atomic.Int64
}

// New starts a router listening on cfg.Listen.
func New(cfg Config) (*Server, error) {
	if cfg.Engines == nil {
		return nil, errors.New("router: no engine source")
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	cfg.ReadHeaderTimeout = cmp.Or(cfg.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	cfg.ReadTimeout = cmp.Or(cfg.ReadTimeout, DefaultReadTimeout)
	cfg.IdleTimeout = cmp.Or(cfg.IdleTimeout, DefaultIdleTimeout)
	cfg.MaxConns = cmp.Or(cfg.MaxConns, DefaultMaxConns)
	cfg.MaxInFlight = cmp.Or(cfg.MaxInFlight, DefaultMaxInFlight)
	if cfg.Stall == (StallRule{}) {
		cfg.Stall = DefaultStallRule
	}
	if err := cfg.Stall.Check(); err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	tl, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("router: listen on %s (http_listen): %w", cfg.Listen, err)
	}
	ln := newCappedListener(tl, cfg.MaxConns)
	s := &Server{
		cfg: cfg, log: cfg.Log, ln: ln, metrics: newMetrics(), clock: clock.Or(cfg.Clock), busy: map[string]int{}, heard: map[string]time.Time{}, done: make(chan struct{}),
		admit: newAdmission(cfg.MaxInFlight), apiKeys: newKeyring(cfg.APIKeys), adminKeys: newKeyring(cfg.AdminKeys),
		client: &http.Client{Transport: &http.Transport{
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     60 * time.Second,
			DisableCompression:  true,
		},
			// An engine's base_url is its own word: a redirect it answers
			// would send the router's requests, clients' prompts in them, to
			// any host it names. The 3xx is the engine's answer, an error.
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
	s.up = newUpstream(s.client, s.client.Transport.(*http.Transport).DialContext)
	mux := http.NewServeMux()
	mux.HandleFunc("/health", s.health)
	mux.HandleFunc("/ready", s.ready)
	mux.HandleFunc("/v1/models", s.models)
	mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, r *http.Request) { s.complete(w, r, Completions) })
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.complete(w, r, Chat) })
	mux.HandleFunc("/connex/v1/engines", s.engines)
	mux.Handle("/metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &APIError{Status: http.StatusNotFound, Type: "not_found_error", Code: CodeNotFound, Message: fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)})
	})
	s.srv = &http.Server{Handler: s.guard(mux), ReadHeaderTimeout: cfg.ReadHeaderTimeout, ReadTimeout: cfg.ReadTimeout, IdleTimeout: cfg.IdleTimeout,
		MaxHeaderBytes: 64 << 10, ErrorLog: slog.NewLogLogger(cfg.Log.Handler(), slog.LevelDebug)}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("router HTTP server stopped", "err", err)
		}
	}()
	return s, nil
}

// URL is the router's base URL (http://host:port).
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops accepting requests and ends the running ones within ctx:
// their clients get an error event (streams) or a 503.
func (s *Server) Close(ctx context.Context) error {
	select {
	case <-s.done:
	default:
		close(s.done)
	}
	err := s.srv.Shutdown(ctx)
	if err != nil {
		err = s.srv.Close()
	}
	s.up.close()
	return err
}

func allow(w http.ResponseWriter, r *http.Request, method string) bool {
	if r.Method == method {
		return true
	}
	w.Header().Set("Allow", method)
	writeError(w, &APIError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: CodeMethod, Message: fmt.Sprintf("%s %s: use %s", r.Method, r.URL.Path, method)})
	return false
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"status":"ok"}`)
}

// ready answers 200 once some model has a prefill and a decode engine.
func (s *Server) ready(w http.ResponseWriter, r *http.Request) {
	_, servable := Models(s.live())
	var ok []string
	for m, yes := range servable {
		if yes {
			ok = append(ok, m)
		}
	}
	if len(ok) == 0 {
		writeError(w, unavailable(CodeNoEngine, "no model has both a live prefill and a live decode engine yet"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(mustJSON(map[string]any{"status": "ready", "models": ok}))
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodGet) {
		return
	}
	live := s.live()
	all, servable := Models(live)
	data := make([]map[string]any, 0, len(all))
	for _, m := range all {
		if servable[m] {
			d := map[string]any{"id": m, "object": "model", "created": 0, "owned_by": "connex"}
			if l := ContextLimit(live, m); l > 0 {
				d["max_model_len"] = l // as vLLM's /v1/models: what every engine of the model holds
			}
			data = append(data, d)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(mustJSON(map[string]any{"object": "list", "data": data}))
}

// engines lists the engines this router sees (operators, tests): JSON
// [{engine_id, role, model, member, in_flight, blocks_free, blocks_total,
// suspect}], by engine id, plus each base_url for a caller with an admin
// key: an engine's own HTTP API has no authentication of its own, so its
// address is not handed to anyone who asks.
func (s *Server) engines(w http.ResponseWriter, r *http.Request) {
	if !allow(w, r, http.MethodGet) {
		return
	}
	admin := s.adminKeys.allows(r)
	es := s.cfg.Engines()
	out := make([]map[string]any, 0, len(es))
	for _, e := range es {
		m := map[string]any{"engine_id": e.Info.GetEngineId(), "role": e.Info.GetRole(), "model": e.Info.GetModel(),
			"member": e.Member, "in_flight": e.Info.GetInFlight(), "blocks_free": e.Info.GetBlocksFree(),
			"blocks_total": e.Info.GetBlocksTotal(), "suspect": e.Suspect}
		if admin {
			m["base_url"] = e.Info.GetBaseUrl()
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b map[string]any) int {
		return strings.Compare(a["engine_id"].(string), b["engine_id"].(string))
	})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(mustJSON(out))
}

// live is the engines of members still in the cluster's view, suspects
// included (flagged): a suspect has not left, and Pick takes one only when
// no other engine qualifies. A model served only by suspects is still
// served rather than answered no_engine (issue 30: on a saturated box every
// member is late at once).
func (s *Server) live() []Engine {
	return s.cfg.Engines()
}

func (s *Server) busySnapshot() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.busy))
	for k, v := range s.busy {
		out[k] = v
	}
	return out
}

// heardFrom records that engine id showed life at now.
func (s *Server) heardFrom(id string, now time.Time) {
	s.mu.Lock()
	if now.After(s.heard[id]) {
		s.heard[id] = now
	}
	s.mu.Unlock()
}

// lastHeard is when engine id last showed life (zero if never).
func (s *Server) lastHeard(id string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.heard[id]
}

// othersHeard is the last token from any engine but id that runs one of
// this router's legs (zero if none).
func (s *Server) othersHeard(id string) time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	var last time.Time
	for e, t := range s.heard {
		if e != id && t.After(last) {
			last = t
		}
	}
	return last
}

// track counts a leg on engine id until the returned func is called.
func (s *Server) track(id string) func() {
	s.mu.Lock()
	s.busy[id]++
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			if s.busy[id]--; s.busy[id] <= 0 {
				delete(s.busy, id)
				delete(s.heard, id) // only legs running on it read it
			}
			s.mu.Unlock()
		})
	}
}

func newRequestID(kind Kind) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	if kind == Chat {
		return "chatcmpl-" + hex.EncodeToString(b[:])
	}
	return "cmpl-" + hex.EncodeToString(b[:])
}
