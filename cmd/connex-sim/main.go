// Command connex-sim is a simulated, deterministic inference engine with an
// OpenAI-compatible HTTP API in the shape of `vllm serve`, one per engine.
// It talks to its own connexd only through the public NATS subject API,
// via the engine shim (package shim); see package simengine for the model, the
// toy tokenizer and the HTTP surface.
//
//	connex-sim --role prefill|decode --nats nats://127.0.0.1:4222 --member <connexd member_id>
//	           --engine-id <id> --listen 127.0.0.1:0 --advertise-url <optional base url>
//	           --model connex-sim --layout small|llama3-8b --blocks N
//	           --tp 1 --block-size 16 --kv-order nhd|hnd|cpu
//	           --prefill-us-per-token 50 --decode-ms-per-token 20 --max-model-len 16384 --log-level warn
//
// Once the KV region exists, the engine is registered and HTTP listens it
// prints one line on stdout:
//
//	connex-sim ready engine=<id> role=<role> http=http://127.0.0.1:<port> member=<member>
//
// SIGINT/SIGTERM: stop accepting, end in-flight streams with an
// engine_shutdown error event, engine.gone, exit 0.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/connex/connex/auth"
	"github.com/connex/connex/engine/shim"
	"github.com/connex/connex/engine/simengine"
	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
)

func main() { os.Exit(run(os.Args[1:])) }

type options struct {
	role, natsURL, natsCreds, natsCA, member, engineID, listen, advertise, model, layout, logLevel string
	blocks, tp, blockSize                                                                          uint32
	kvOrder                                                                                        string
	prefillUS, maxModelLen                                                                         int
	decodeMS                                                                                       float64
	tokenize                                                                                       bool
}

func parse(args []string) (*options, error) {
	o := &options{}
	fs := pflag.NewFlagSet("connex-sim", pflag.ContinueOnError)
	fs.StringVar(&o.role, "role", "decode", "engine role: prefill or decode (advertised to routers; any engine serves any leg)")
	fs.StringVar(&o.natsURL, "nats", nats.DefaultURL, "NATS server of the engine's connexd")
	fs.StringVar(&o.natsCreds, "nats-creds", os.Getenv("CONNEX_NATS_CREDS"), "NATS credentials of this engine (connexd auth creds --role engine --member M --engine E)")
	fs.StringVar(&o.natsCA, "nats-tls-ca", "", "CA certificate (PEM) that verifies the NATS server")
	fs.StringVar(&o.member, "member", "", "member_id of the engine's connexd (required)")
	fs.StringVar(&o.engineID, "engine-id", "", "engine id, unique in the cluster (required)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:0", "HTTP listen address (port 0: any free port)")
	fs.StringVar(&o.advertise, "advertise-url", "", "base URL routers use to reach this engine (default: http://<listen address>)")
	fs.StringVar(&o.model, "model", "connex-sim", "served model name")
	fs.StringVar(&o.layout, "layout", "small", "KV layout: small or llama3-8b")
	fs.Uint32Var(&o.blocks, "blocks", 0, "KV blocks in the region (0: the layout's default)")
	fs.Uint32Var(&o.tp, "tp", 1, "tensor-parallel size: one KV region per rank, each with its share of the KV heads; engines of other sizes exchange KV with it")
	fs.Uint32Var(&o.blockSize, "block-size", 0, "tokens per KV block (0: the layout's default, 16)")
	fs.StringVar(&o.kvOrder, "kv-order", "nhd", "in-block KV order: nhd (vLLM's GPU cache), hnd, or cpu (vLLM's CPU cache: K transposed)")
	fs.IntVar(&o.prefillUS, "prefill-us-per-token", 50, "prefill cost per prompt token, in microseconds")
	fs.Float64Var(&o.decodeMS, "decode-ms-per-token", 20, "decode cost per output token, in milliseconds")
	fs.IntVar(&o.maxModelLen, "max-model-len", 16384, "longest prompt plus completion, in tokens")
	fs.BoolVar(&o.tokenize, "tokenize", true, "serve POST /tokenize (false plays an engine without it: the router then learns a text prompt's length only from its prefill)")
	fs.StringVar(&o.logLevel, "log-level", "warn", "debug, info, warn or error (structured, to stderr)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	switch {
	case o.role != shim.RolePrefill && o.role != shim.RoleDecode:
		return nil, fmt.Errorf("--role %q: allowed: prefill, decode", o.role)
	case o.member == "":
		return nil, errors.New("--member is required (the connexd member_id)")
	case o.engineID == "":
		return nil, errors.New("--engine-id is required")
	case o.prefillUS < 0 || o.decodeMS < 0:
		return nil, errors.New("--prefill-us-per-token and --decode-ms-per-token must be >= 0")
	case o.maxModelLen < 2:
		return nil, errors.New("--max-model-len must be at least 2")
	}
	if err := (auth.Identity{Role: auth.RoleEngine, Member: o.member, Engine: o.engineID}).Validate(); err != nil {
		return nil, fmt.Errorf("--member/--engine-id: %w", err)
	}
	return o, nil
}

func run(args []string) int {
	o, err := parse(args)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "connex-sim: %v\n", err)
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "connex-sim: --log-level %q: allowed: debug, info, warn, error\n", o.logLevel)
		return 2
	}
	// The shim and the server add engine= to their lines (libLog); this
	// command's lines get it from log.
	libLog := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	log := libLog.With("engine", o.engineID)
	layout, err := simengine.LookupLayout(o.layout, o.blocks, simengine.Shape{TP: o.tp, BlockSize: o.blockSize, Order: o.kvOrder})
	if err != nil {
		fmt.Fprintf(os.Stderr, "connex-sim: --layout: %v\n", err)
		return 2
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		fmt.Fprintf(os.Stderr, "connex-sim: listen %s: %v\n", o.listen, err)
		return 1
	}
	httpURL := "http://" + ln.Addr().String()
	base := o.advertise
	if base == "" {
		base = httpURL
	}
	base = strings.TrimSuffix(base, "/")
	// The engine's replies come to its own inbox prefix, the only one its
	// credentials may subscribe to.
	id := auth.Identity{Role: auth.RoleEngine, Member: o.member, Engine: o.engineID}
	copts := []nats.Option{nats.CustomInboxPrefix(id.InboxPrefix())}
	if o.natsCreds != "" {
		copts = append(copts, nats.UserCredentials(o.natsCreds))
	}
	if o.natsCA != "" {
		copts = append(copts, nats.RootCAs(o.natsCA))
	}
	nc, err := nats.Connect(o.natsURL, append(copts, nats.Name("connex-sim "+o.engineID), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil { // nil: our own Close
				log.Warn("NATS disconnected; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("NATS reconnected") }))...)
	if err != nil {
		fmt.Fprintf(os.Stderr, "connex-sim: connect to NATS %s: %v\n", o.natsURL, err)
		return 1
	}
	defer nc.Close()
	// Advertise what the engine can hold: a request longer than its KV
	// region fits nowhere, whatever --max-model-len says.
	if lim := simengine.ContextLimit(o.maxModelLen, layout.Blocks, layout.BlockSize); lim < o.maxModelLen {
		log.Info("max_model_len lowered to what the KV region holds", "max_model_len", lim, "flag", o.maxModelLen, "blocks", layout.Blocks, "block_size", layout.BlockSize)
		o.maxModelLen = lim
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	eng, err := shim.Open(ctx, shim.Config{
		NC: nc, Member: o.member, EngineID: o.engineID, Role: o.role, Model: o.model, BaseURL: base,
		Layout: layout, MaxModelLen: uint32(o.maxModelLen), Log: libLog,
	})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "connex-sim: %v\n", err)
		return 1
	}
	srv := simengine.NewServer(simengine.Config{
		KV: simengine.ShimKV{Engine: eng}, EngineID: o.engineID, Role: o.role, Model: o.model, MaxModelLen: o.maxModelLen, NoTokenize: !o.tokenize,
		PrefillPerToken: time.Duration(o.prefillUS) * time.Microsecond,
		DecodePerToken:  time.Duration(o.decodeMS * float64(time.Millisecond)),
		Log:             libLog,
	})
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelDebug)}
	serveErr := make(chan error, 1)
	go func() { serveErr <- hs.Serve(ln) }()
	fmt.Printf("connex-sim ready engine=%s role=%s http=%s member=%s\n", o.engineID, o.role, httpURL, o.member)

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	code := 0
	select {
	case s := <-sig:
		log.Info("shutting down", "signal", s.String())
	case err := <-serveErr:
		log.Error("HTTP server failed", "err", err)
		code = 1
	}
	// In-flight requests end first (streams get an engine_shutdown event),
	// then the listener closes and idle connections with it.
	sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer scancel()
	halted := make(chan error, 1)
	go func() { halted <- srv.Shutdown(sctx) }()
	if err := hs.Shutdown(sctx); err != nil {
		log.Warn("HTTP shutdown", "err", err)
		_ = hs.Close()
	}
	if err := <-halted; err != nil {
		log.Warn("in-flight requests", "err", err)
	}
	if err := eng.Close(); err != nil {
		log.Warn("close engine", "err", err)
	}
	fmt.Printf("connex-sim stopped engine=%s\n", o.engineID)
	return code
}
