package simengine

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
	"net/http"
	"sync"
	"time"

	"github.com/connex/connex/engine/shim"
	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// MaxBodyBytes bounds a request body (a 16k-token prompt as JSON ids is
// ~100 KiB).
const MaxBodyBytes = 8 << 20

// errShutdown ends in-flight requests when the server shuts down.
var errShutdown = errors.New("engine shutting down")

// Config configures a Server.
type Config struct {
	KV              KV
	EngineID        string
	Role            string // shim.RolePrefill or shim.RoleDecode (advertised; any engine serves any leg)
	Model           string // served model name
	MaxModelLen     int    // longest prompt + completion, in tokens
	PrefillPerToken time.Duration
	DecodePerToken  time.Duration
	// NoTokenize leaves POST /tokenize out (404), as engines without it.
	NoTokenize bool
	// Log receives the server's lines, each with engine=EngineID added
	// here: give it a logger that does not name the engine already. Nil
	// discards.
	Log *slog.Logger
	// Now is the clock for response timestamps; nil is time.Now.
	Now func() time.Time
}

// Server is the simulated engine's OpenAI-compatible HTTP API.
type Server struct {
	cfg  Config
	m    *metrics
	log  *slog.Logger
	mux  *http.ServeMux
	stop context.Context
	halt context.CancelCauseFunc
	wg   sync.WaitGroup
}

// NewServer builds the server; serve its Handler.
func NewServer(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.KV != nil {
		if rs := cfg.KV.Ranks(); len(rs) > 0 {
			cfg.MaxModelLen = ContextLimit(cfg.MaxModelLen, rs[0].Layout.Blocks, rs[0].Layout.BlockSize)
		}
	}
	s := &Server{cfg: cfg, m: newMetrics(cfg.KV), log: cfg.Log.With("engine", cfg.EngineID), mux: http.NewServeMux()}
	s.stop, s.halt = context.WithCancelCause(context.Background())
	s.mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	s.mux.HandleFunc("/v1/models", s.models)
	s.mux.Handle("/metrics", promhttp.HandlerFor(s.m.reg, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("/v1/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, false) })
	s.mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) { s.generate(w, r, true) })
	if !cfg.NoTokenize {
		s.mux.HandleFunc("/tokenize", s.tokenize)
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, &httpError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found", Message: fmt.Sprintf("no route %s %s", r.Method, r.URL.Path)})
	})
	return s
}

// Handler is the HTTP handler.
func (s *Server) Handler() http.Handler { return s.mux }

// Shutdown ends every in-flight request (streams get an engine_shutdown
// error event, then [DONE]; their decode requests are left to their
// connexd for a takeover) and waits for them up to ctx.
func (s *Server) Shutdown(ctx context.Context) error {
	s.halt(errShutdown)
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sim: in-flight requests did not end: %w", ctx.Err())
	}
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	b, _ := json.Marshal(map[string]any{"object": "list", "data": []any{map[string]any{
		"id": s.cfg.Model, "object": "model", "created": s.cfg.Now().Unix(), "owned_by": "connex-sim",
		"root": s.cfg.Model, "parent": nil, "max_model_len": s.cfg.MaxModelLen,
	}}})
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

func newReqID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

func (s *Server) blocksFor(tokens int) int {
	bs := int(s.layout().BlockSize)
	return (tokens + bs - 1) / bs
}

// layout is the engine's KV layout (rank 0's).
func (s *Server) layout() kvmem.Layout { return s.cfg.KV.Ranks()[0].Layout }

// pullBlocks is how many of this engine's blocks a pull of the hold p
// names needs (kvmem.PullSize: as many as the hold's between equal block
// sizes, what its tokens need between different ones).
func (s *Server) pullBlocks(p *messages.KVTransferParams) (int, error) {
	l := s.layout()
	_, n, err := kvmem.PullSize(cmp.Or(p.BlockSize, l.BlockSize), len(p.RemoteBlockIds), p.RemoteNumTokens, l.BlockSize)
	return n, err
}

// generate serves /v1/completions and /v1/chat/completions.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, chat bool) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		writeError(w, &httpError{Status: http.StatusMethodNotAllowed, Type: "invalid_request_error", Code: "method_not_allowed", Message: r.Method + " " + r.URL.Path + ": use POST"})
		return
	}
	if s.stop.Err() != nil {
		writeError(w, serverError(http.StatusServiceUnavailable, "engine_shutdown", "engine %s is shutting down", s.cfg.EngineID))
		return
	}
	s.wg.Add(1)
	defer s.wg.Done()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			s.reject(w, &httpError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error", Code: "request_too_large", Message: fmt.Sprintf("request body over %d bytes", MaxBodyBytes)})
			return
		}
		s.reject(w, badRequest("invalid_body", "", "reading the request body: %v", err))
		return
	}
	g, herr := parseRequest(body, chat, s.cfg.Model)
	if herr == nil {
		herr = s.check(g)
	}
	if herr != nil {
		s.reject(w, herr)
		return
	}
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	stopWatch := context.AfterFunc(s.stop, func() { cancel(errShutdown) })
	defer stopWatch()
	end := s.cfg.KV.Begin()
	defer end()
	prefix := "cmpl-"
	if chat {
		prefix = "chatcmpl-"
	}
	o := &output{w: w, g: g, id: newReqID(prefix), created: s.cfg.Now().Unix()}
	status := s.run(ctx, o)
	s.m.requests.WithLabelValues(status).Inc()
}

func (s *Server) reject(w http.ResponseWriter, e *httpError) {
	s.m.requests.WithLabelValues("bad_request").Inc()
	s.log.Debug("request rejected", "status", e.Status, "code", e.Code, "msg", e.Message)
	writeError(w, e)
}

// ContextLimit is the longest prompt + completion, in tokens, an engine
// with maxModelLen and a KV region of blocks × blockSize tokens can hold.
func ContextLimit(maxModelLen int, blocks, blockSize uint32) int {
	if blocks == 0 || blockSize == 0 {
		return maxModelLen
	}
	return min(maxModelLen, int(blocks)*int(blockSize))
}

func promptParam(chat bool) string {
	if chat {
		return "messages"
	}
	return "prompt"
}

// check validates a request against this engine: context length and
// region size. It allocates nothing.
func (s *Server) check(g *genRequest) *httpError {
	n := len(g.tokens)
	if g.params.GetDoRemoteDecode() {
		g.maxTokens = 1 // a prefill leg answers with one token
	}
	if n >= s.cfg.MaxModelLen {
		// The prompt alone leaves no room for a token: the prompt is at
		// fault, whatever max_tokens says.
		return badRequest("context_length_exceeded", promptParam(g.chat), "This model's maximum context length is %d tokens. However, your prompt has %d tokens. Please reduce the length of the prompt.", s.cfg.MaxModelLen, n)
	}
	if g.maxTokens == toContextEnd {
		g.maxTokens = s.cfg.MaxModelLen - n
	}
	if total := n + g.maxTokens; total > s.cfg.MaxModelLen {
		return badRequest("context_length_exceeded", "max_tokens", "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d in the completion). Please reduce the length of the prompt or completion.", s.cfg.MaxModelLen, total, n, g.maxTokens)
	}
	need := s.blocksFor(n + g.maxTokens)
	if g.params.GetDoRemoteDecode() {
		need = s.blocksFor(n)
	}
	if p := g.params; p.GetDoRemotePrefill() {
		if p.TransferId == "" || p.RemoteCtrl.GetMember() == "" || len(p.RemoteBlockIds) == 0 {
			return badRequest("invalid_value", "kv_transfer_params", "kv_transfer_params with do_remote_prefill need transfer_id, remote_ctrl and remote_block_ids (the prefill response's params)")
		}
		n, err := s.pullBlocks(p)
		if err != nil {
			return badRequest("invalid_value", "kv_transfer_params", "kv_transfer_params: %v", err)
		}
		need = max(need, n)
	}
	if total := s.layout().Blocks; uint64(need) > uint64(total) {
		return badRequest("context_length_exceeded", "prompt", "the request needs %d KV blocks, this engine's KV region has %d", need, total)
	}
	return nil
}

// pace waits until deadline, or returns ctx's cause.
func pace(ctx context.Context, deadline time.Time) error {
	d := time.Until(deadline)
	if d <= 0 {
		return context.Cause(ctx)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// prefill computes the KV of positions [KVDone, to) at PrefillPerToken
// per token.
func (s *Server) prefill(ctx context.Context, seq *Sequence, to int) error {
	start := time.Now()
	n := to - seq.KVDone()
	if err := seq.Compute(to); err != nil {
		return err
	}
	return pace(ctx, start.Add(time.Duration(n)*s.cfg.PrefillPerToken))
}

// run serves a validated request and returns its status label.
func (s *Server) run(ctx context.Context, o *output) string {
	g := o.g
	switch {
	case g.params.GetDoRemoteDecode():
		return s.prefillLeg(ctx, o)
	case g.params.GetDoRemotePrefill():
		return s.decodeLeg(ctx, o)
	}
	return s.local(ctx, o)
}

// interrupted reports a request that ended early for err and returns its label.
func (s *Server) interrupted(o *output, err error) string {
	switch {
	case errors.Is(err, errShutdown):
		o.fail(serverError(http.StatusServiceUnavailable, "engine_shutdown", "engine %s is shutting down: resend the request (prompt plus the tokens received) elsewhere", s.cfg.EngineID))
		return "shutdown"
	case errors.Is(err, shim.ErrFenced):
		s.m.fenced.Inc()
		s.log.Warn("request fenced: stream stopped", "err", err)
		if o.started {
			panic(http.ErrAbortHandler) // the stream is someone else's now: cut it
		}
		writeError(o.w, &httpError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "fenced", Message: err.Error()})
		return "fenced"
	case errors.Is(err, context.Canceled):
		return "canceled" // the client went away
	case errors.Is(err, shim.ErrRegionLost):
		o.fail(serverError(http.StatusServiceUnavailable, "region_lost", "engine %s: %v; it is making a new one: resend the request elsewhere", s.cfg.EngineID, err))
		return "region_lost"
	}
	o.fail(serverError(http.StatusInternalServerError, "internal_error", "%v", err))
	return "error"
}

// local serves a request without kv_transfer_params: prefill, then decode.
func (s *Server) local(ctx context.Context, o *output) string {
	g := o.g
	blocks, err := s.cfg.KV.Alloc(ctx, s.blocksFor(len(g.tokens)+g.maxTokens))
	if err != nil {
		return s.allocFailed(ctx, o, err)
	}
	defer s.cfg.KV.Free(blocks)
	seq := NewSequence(s.cfg.KV.Ranks(), blocks, g.tokens)
	if err := s.prefill(ctx, seq, len(g.tokens)); err != nil {
		return s.interrupted(o, err)
	}
	s.m.prefills.WithLabelValues(PrefillLocal).Inc()
	s.m.prefillTokens.Add(float64(len(g.tokens)))
	o.connex = &ConnexInfo{KVLoad: "local", Prefills: 1, EngineID: s.cfg.EngineID}
	return s.decode(ctx, o, seq, nil)
}

func (s *Server) allocFailed(ctx context.Context, o *output, err error) string {
	if ctx.Err() != nil {
		return s.interrupted(o, context.Cause(ctx))
	}
	o.fail(serverError(http.StatusServiceUnavailable, "no_kv_blocks", "engine %s: %v", s.cfg.EngineID, err))
	return "error"
}

// prefillLeg computes the prompt's KV, holds it and answers with one
// token and the hold's kv_transfer_params.
func (s *Server) prefillLeg(ctx context.Context, o *output) string {
	g := o.g
	blocks, err := s.cfg.KV.Alloc(ctx, s.blocksFor(len(g.tokens)))
	if err != nil {
		return s.allocFailed(ctx, o, err)
	}
	seq := NewSequence(s.cfg.KV.Ranks(), blocks, g.tokens)
	if err := s.prefill(ctx, seq, len(g.tokens)); err != nil {
		s.cfg.KV.Free(blocks)
		return s.interrupted(o, err)
	}
	s.m.prefills.WithLabelValues(PrefillRemote).Inc()
	s.m.prefillTokens.Add(float64(len(g.tokens)))
	tok := seq.Next() // the prefill's own token; the decode leg computes it again
	params, err := s.cfg.KV.Hold(ctx, blocks, uint32(len(g.tokens)))
	if err != nil {
		s.cfg.KV.Free(blocks)
		o.fail(serverError(http.StatusServiceUnavailable, "hold_failed", "engine %s: %v", s.cfg.EngineID, err))
		return "error"
	}
	params.DoRemotePrefill, params.DoRemoteDecode = true, false
	o.params = paramsJSON(params)
	o.connex = &ConnexInfo{KVLoad: "local", Prefills: 1, EngineID: s.cfg.EngineID}
	// A client gone before the answer naming the hold reached it leaves a
	// hold nobody knows of: release it now rather than at claim_s.
	undelivered := func() string {
		s.releaseOwn(ctx, params.GetTransferId())
		return "canceled"
	}
	if ctx.Err() != nil {
		return undelivered()
	}
	if err := o.begin(); err != nil {
		return undelivered()
	}
	if err := o.token(tok, true); err != nil {
		return undelivered()
	}
	if err := o.end(); err != nil {
		return undelivered()
	}
	return "ok"
}

// releaseOwn releases a hold whose prefill answer was not delivered.
func (s *Server) releaseOwn(ctx context.Context, transferID string) {
	c, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := s.cfg.KV.Release(c, transferID); err != nil {
		s.log.Warn("could not release the hold of an undelivered prefill answer (it is freed at claim_s)", "err", err)
		return
	}
	s.log.Info("released the hold of an undelivered prefill answer (its client left)", "transfer", transferID)
}

// decodeLeg loads the KV the params name (only min(remote_num_tokens,
// tokens) of it), computes the rest locally, and generates.
func (s *Server) decodeLeg(ctx context.Context, o *output) string {
	g, p := o.g, o.g.params
	nRemote, err := s.pullBlocks(p) // checked by check
	if err != nil {
		o.fail(badRequest("invalid_value", "kv_transfer_params", "kv_transfer_params: %v", err))
		return "error"
	}
	t0 := time.Now()
	blocks, err := s.cfg.KV.Alloc(ctx, max(nRemote, s.blocksFor(len(g.tokens)+g.maxTokens)))
	if err != nil {
		return s.allocFailed(ctx, o, err)
	}
	defer s.cfg.KV.Free(blocks)
	id := p.ConnexRequestId
	if id == "" {
		id = "sim-" + s.cfg.EngineID + "-" + newReqID("")
	}
	// request.start runs to its end even if the client leaves meanwhile:
	// abandoned half-way, the request actor could exist on the connexd with
	// nobody to finish it, keeping the prefill hold alive.
	tAlloc := time.Now()
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	act, err := s.cfg.KV.StartRequest(sctx, shim.RequestSpec{ID: id, Params: p, Tokens: g.tokens, Takeover: p.ConnexResume, MaxTokens: uint32(g.maxTokens)})
	scancel()
	if err != nil {
		if ctx.Err() != nil {
			return s.interrupted(o, context.Cause(ctx))
		}
		o.fail(serverError(http.StatusServiceUnavailable, "request_start_failed", "engine %s: %v", s.cfg.EngineID, err))
		return "error"
	}
	finish := func() {
		// Long enough to outlast a NATS or connexd restart: an unfinished
		// request keeps its prefill hold alive.
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := act.Finish(c); err != nil {
			s.log.Warn("request.finish failed", "request", id, "err", err)
		}
	}
	if ctx.Err() != nil {
		finish()
		return s.interrupted(o, context.Cause(ctx))
	}
	// Fencing (a takeover elsewhere) ends the request at once.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(act.Context(), func() {
		if c := context.Cause(act.Context()); errors.Is(c, shim.ErrFenced) {
			cancel(c)
		}
	})()

	seq := NewSequence(s.cfg.KV.Ranks(), blocks, g.tokens)
	loaded := min(int(p.RemoteNumTokens), len(g.tokens))
	info := &ConnexInfo{KVLoad: "pulled", EngineID: s.cfg.EngineID}
	tStart := time.Now()
	lerr := s.load(ctx, seq, p, blocks[:nRemote], loaded)
	tLoad := time.Now()
	var le *shim.LoadError
	switch {
	case lerr == nil:
		s.m.kvLoads.WithLabelValues("ok").Inc()
		s.m.kvLoadedTokens.Add(float64(loaded))
		info.LoadedTokens = loaded
		start := time.Now()
		if err := seq.Compute(len(g.tokens)); err != nil {
			finish()
			return s.interrupted(o, err)
		}
		info.RecomputedTokens = len(g.tokens) - loaded
		s.m.recomputedTokens.Add(float64(info.RecomputedTokens))
		if err := pace(ctx, start.Add(time.Duration(info.RecomputedTokens)*s.cfg.PrefillPerToken)); err != nil {
			return s.stopped(o, err, act, finish)
		}
		s.log.Info("decode leg loaded", "request", id, "transfer", p.TransferId, "resume", p.ConnexResume,
			"loaded_tokens", loaded, "recomputed_tokens", info.RecomputedTokens, "alloc_us", tAlloc.Sub(t0).Microseconds(),
			"request_start_us", tStart.Sub(tAlloc).Microseconds(), "load_us", tLoad.Sub(tStart).Microseconds(),
			"recompute_us", time.Since(tLoad).Microseconds())
	case errors.As(lerr, &le):
		s.m.kvLoads.WithLabelValues(outcomeLabel(le.Reason)).Inc()
		if le.Policy != shim.PolicyRecompute {
			finish()
			o.fail(serverError(http.StatusServiceUnavailable, "kv_load_failed", "%v (kv_load_failure_policy=fail)", le))
			return "kv_load_failed"
		}
		s.log.Info("KV load failed; recomputing locally (kv_load_failure_policy=recompute)", "err", le)
		seq = NewSequence(s.cfg.KV.Ranks(), blocks, g.tokens)
		if err := s.prefill(ctx, seq, len(g.tokens)); err != nil {
			return s.stopped(o, err, act, finish)
		}
		s.m.prefills.WithLabelValues(PrefillRecompute).Inc()
		s.m.prefillTokens.Add(float64(len(g.tokens)))
		info = &ConnexInfo{KVLoad: "recomputed", Prefills: 1, EngineID: s.cfg.EngineID, LoadError: le.Error()}
	default:
		return s.stopped(o, lerr, act, finish)
	}
	if p.ConnexResume {
		s.m.resumes.Inc()
	}
	o.connex = info
	return s.decode(ctx, o, seq, &decodeActivation{act: act, finish: finish})
}

// load pulls the hold into dst and verifies the first n positions.
func (s *Server) load(ctx context.Context, seq *Sequence, p *messages.KVTransferParams, dst []uint32, n int) error {
	if _, err := s.cfg.KV.Pull(ctx, p, dst); err != nil {
		return err
	}
	if err := seq.Load(n); err != nil {
		return &shim.LoadError{TransferID: p.TransferId, Code: 0, Reason: "corrupt", Policy: s.cfg.KV.Policy(), Detail: err.Error()}
	}
	return nil
}

// stopped ends a decode request interrupted by err: the client left
// (finish: release the hold), the engine shuts down (leave the request to
// its connexd for a takeover), or it was fenced (nothing to release).
func (s *Server) stopped(o *output, err error, act Activation, finish func()) string {
	switch {
	case errors.Is(err, errShutdown):
		act.Abandon()
	case errors.Is(err, shim.ErrFenced):
		act.Abandon()
	case errors.Is(err, shim.ErrRegionLost):
		act.Abandon() // the hold is alive: the request resumes on another engine
	default:
		finish()
	}
	return s.interrupted(o, err)
}

type decodeActivation struct {
	act    Activation
	finish func()
}

// decode generates maxTokens tokens at DecodePerToken each, one chunk per
// token, reporting them to the request (decode legs).
func (s *Server) decode(ctx context.Context, o *output, seq *Sequence, da *decodeActivation) string {
	g := o.g
	stop := func(err error) string {
		if da != nil {
			return s.stopped(o, err, da.act, da.finish)
		}
		return s.interrupted(o, err)
	}
	start := time.Now()
	if err := o.begin(); err != nil {
		return stop(context.Canceled)
	}
	for i := range g.maxTokens {
		if err := pace(ctx, start.Add(time.Duration(i+1)*s.cfg.DecodePerToken)); err != nil {
			return stop(err)
		}
		tok := seq.Next()
		seq.Append(tok)
		if da != nil {
			da.act.Report(tok)
		}
		if err := o.token(tok, i == g.maxTokens-1); err != nil {
			return stop(context.Canceled)
		}
	}
	if err := o.end(); err != nil {
		return stop(context.Canceled)
	}
	if da != nil {
		da.finish()
	}
	return "ok"
}
