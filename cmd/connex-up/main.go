// Command connex-up brings up a local prefill/decode Connex cluster — the
// router (connexd --role router, embedding NATS) and, per engine, a connexd
// plus a connex-sim simulated engine — prints how to send it a streamed
// completion, how to kill a decode engine to watch the stream resume, where
// every process's metrics are, and how to point a shell at the cluster
// (an env file for `connexd status` and the nats CLI). A process that dies
// unasked is started again after --restart-after, so the demo can be
// repeated. Ctrl-C (SIGINT) or SIGTERM stops every process it started.
// `make run` builds the binaries and runs it. It builds nothing itself.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/connex/connex/harness/localcluster"
	"github.com/spf13/pflag"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	// After the first Ctrl-C, a second one ends connex-up at once; the
	// kernel's parent-death signal still stops the children.
	context.AfterFunc(ctx, stop)
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// natscliVersion is the nats CLI the Makefile builds into bin/ (the same
// pin as scripts/test.sh).
const natscliVersion = "v0.5.0"

// run starts the cluster, prints the banner and, until ctx ends, each
// automatic restart; then it stops every process.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	f, err := parseFlags(args, stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "connex-up: %v\n", err)
		return 2
	}
	o := f.opts
	out := &lockedWriter{w: stdout}
	if !f.quiet {
		o.Log = &lockedWriter{w: stderr}
	}
	o.OnRestart = func(ev localcluster.RestartEvent) { fmt.Fprintln(out, restartLine(ev, o)) }
	fmt.Fprintf(out, "connex-up: starting the router, %d prefill and %d decode engines…\n", o.Prefill, o.Decode)
	c, err := localcluster.Start(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "connex-up: %v\n", err)
		return 1
	}
	files, err := writeFiles(c, f.envFile)
	if err != nil {
		fmt.Fprintf(stderr, "connex-up: %v\n", err)
		_ = c.Close()
		return 1
	}
	fmt.Fprint(out, banner(c, o, files, natsCLI(f.natsCLI)))
	<-ctx.Done()
	fmt.Fprintln(out, "\nconnex-up: stopping every process…")
	files.removeStable()
	if err := c.Close(); err != nil {
		fmt.Fprintf(stderr, "connex-up: %v\n", err)
		return 1
	}
	fmt.Fprintln(out, "connex-up: stopped")
	return 0
}

// lockedWriter serializes writes: restart lines come from the cluster's
// goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

// flags are connex-up's parsed flags.
type flags struct {
	opts    localcluster.Options
	quiet   bool   // drop the processes' own log lines
	envFile string // the stable copy of the env file ("" none)
	natsCLI string // the nats CLI the banner names
}

// parseFlags reads connex-up's flags: the cluster's options (with
// automatic restarts and every connexd's metrics on) and connex-up's own.
func parseFlags(args []string, stderr io.Writer) (flags, error) {
	d := localcluster.Defaults()
	d.Restart, d.Metrics = localcluster.DefaultRestart, true
	fs := pflag.NewFlagSet("connex-up", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: connex-up --connexd PATH --sim PATH [flags]\n\nStarts a local P/D cluster; Ctrl-C stops it.\n\nflags:")
		fs.PrintDefaults()
	}
	connexd := fs.String("connexd", "./bin/connexd", "connexd binary")
	sim := fs.String("sim", "./bin/connex-sim", "connex-sim binary")
	httpListen := fs.String("http", "127.0.0.1:8000", "router's OpenAI-compatible HTTP listen address")
	natsURL := fs.String("nats-url", "", "external NATS server with JetStream (default: the router embeds one)")
	natsListen := fs.String("nats-listen", "127.0.0.1:0", "embedded NATS address (port 0 = any free port)")
	prefill := fs.Int("prefill", d.Prefill, "prefill engines")
	decode := fs.Int("decode", d.Decode, "decode engines")
	model := fs.String("model", d.Model, "served model name")
	layout := fs.String("layout", d.Layout, "engines' KV layout: small or llama3-8b")
	blocks := fs.Int("blocks", 0, "KV blocks per engine (0 = connex-sim's default)")
	prefillUS := fs.Int("prefill-us-per-token", int(d.PrefillPerToken/time.Microsecond), "simulated prefill cost per prompt token, µs")
	decodeMS := fs.Int("decode-ms-per-token", int(d.DecodePerToken/time.Millisecond), "simulated decode time per output token, ms")
	connexdArgs := fs.StringArray("connexd-arg", nil, "extra flag for every connexd, repeatable (e.g. --connexd-arg=--kv-load-failure-policy=recompute)")
	vllmArgs := fs.StringArray("vllm-arg", nil, "extra flag for every `vllm serve`, repeatable (e.g. --vllm-arg=--tool-call-parser --vllm-arg=pythonic); needs --vllm")
	logLevel := fs.String("log-level", "warn", "every process's log level: debug, info, warn or error")
	dir := fs.String("dir", "", "directory for the connexds' data (default: a temporary one, removed at exit)")
	quiet := fs.Bool("quiet", false, "do not show the processes' log lines")
	vllmBin := fs.String("vllm", "", "run real `vllm serve` engines with this vllm command instead of connex-sim (make run-vllm sets it up)")
	vllmModel := fs.String("vllm-model", "", "with --vllm: the model directory to serve (--model is its served name)")
	vllmMaxLen := fs.Int("vllm-max-model-len", 4096, "with --vllm: vllm serve --max-model-len")
	connectorSettings := fs.StringArray("vllm-connector", nil, "with --vllm: a ConnexConnector setting KEY=VALUE for every engine (kv_connector_extra_config; VALUE is JSON, else a string), repeatable, e.g. --vllm-connector idle_wait_ms=0")
	engineLogs := fs.Bool("engine-logs", false, "with --vllm: show the engines' own log lines on screen too (default: each engine's go to a file in --engine-log-dir, whose paths the banner prints)")
	engineLogDir := fs.String("engine-log-dir", filepath.Join(os.TempDir(), "connex-up-logs"), "with --vllm: directory of the engines' log files (<engine>.log, truncated at each start, kept after exit)")
	prefillTP := fs.Int("prefill-tp", 1, "with --vllm: every prefill engine's tensor-parallel size (vllm serve --tensor-parallel-size; one worker process per rank, each rank's OpenMP thread on a core of its own)")
	decodeTP := fs.Int("decode-tp", 1, "with --vllm: every decode engine's tensor-parallel size (as --prefill-tp; prefill and decode sizes may differ: connexd translates the KV between them)")
	vllmPolicy := fs.String("kv-load-failure-policy", "fail", "with --vllm: vLLM's kv_load_failure_policy on decode engines, fail or recompute")
	engineUser := fs.String("engine-user", "", "run each connex-sim under its own uid: UID[:GID] plus the engine's index (as root; engines then read neither a connexd's member.creds nor each other's engine.creds, docs/security.md \"Engines under their own uid\"); --sim must be executable by those users")
	apiKeyFile := fs.String("api-key-file", "", "file whose first line is the API key the router then requires on /v1/* (default: none)")
	restartAfter := fs.Duration("restart-after", d.Restart.After, "start a process that died unasked (kill -9, a crash) again after this long, doubling while it keeps dying (at most 30s); 0 turns restarts off")
	envFile := fs.String("env-file", defaultEnvFile(), "also write the env file that points a shell at the cluster here (`. FILE`; removed at exit); empty: only <cluster dir>/connex.env")
	natsCLI := fs.String("nats-cli", "./bin/nats", "the nats CLI the banner names (make run builds natscli "+natscliVersion+" there); if missing, `nats` on PATH")
	if err := fs.Parse(args); err != nil {
		return flags{}, err
	}
	if fs.NArg() > 0 {
		return flags{}, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *prefill < 1 || *decode < 1 {
		return flags{}, fmt.Errorf("--prefill and --decode must be at least 1 (got %d and %d)", *prefill, *decode)
	}
	if *prefillUS < 0 || *decodeMS < 0 {
		return flags{}, errors.New("--prefill-us-per-token and --decode-ms-per-token must not be negative")
	}
	d.Connexd, d.Sim = *connexd, *sim
	d.RouterHTTP, d.NATSURL, d.NATSListen = *httpListen, *natsURL, *natsListen
	d.Prefill, d.Decode = *prefill, *decode
	d.Model, d.Layout, d.Blocks = *model, *layout, *blocks
	d.PrefillPerToken = time.Duration(*prefillUS) * time.Microsecond
	d.DecodePerToken = time.Duration(*decodeMS) * time.Millisecond
	d.ConnexdArgs = *connexdArgs
	d.LogLevel = *logLevel
	d.Dir = *dir
	if *prefillTP < 1 || *decodeTP < 1 {
		return flags{}, fmt.Errorf("--prefill-tp and --decode-tp must be at least 1 (got %d and %d)", *prefillTP, *decodeTP)
	}
	if *vllmBin != "" {
		d.VLLM = &localcluster.VLLM{Bin: *vllmBin, Model: *vllmModel, MaxModelLen: *vllmMaxLen, LoadFailurePolicy: *vllmPolicy, Args: *vllmArgs,
			PrefillTP: *prefillTP, DecodeTP: *decodeTP}
		if len(*connectorSettings) > 0 {
			d.VLLM.Connector = map[string]any{}
			for _, kv := range *connectorSettings {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" {
					return flags{}, fmt.Errorf("--vllm-connector %q: want KEY=VALUE", kv)
				}
				var val any
				if json.Unmarshal([]byte(v), &val) != nil {
					val = v // not JSON: a string
				}
				d.VLLM.Connector[k] = val
			}
		}
		if !*engineLogs {
			if *engineLogDir == "" {
				return flags{}, errors.New("--engine-log-dir is empty (--engine-logs shows the engines' lines on screen instead)")
			}
			d.VLLM.LogDir = *engineLogDir
		}
	} else if *vllmModel != "" || len(*vllmArgs) > 0 || len(*connectorSettings) > 0 || *prefillTP != 1 || *decodeTP != 1 {
		return flags{}, errors.New("--vllm-model, --vllm-arg, --vllm-connector, --prefill-tp and --decode-tp need --vllm")
	}
	if *engineUser != "" {
		u, err := parseUser(*engineUser)
		if err != nil {
			return flags{}, fmt.Errorf("--engine-user: %w", err)
		}
		if d.VLLM != nil {
			return flags{}, errors.New("--engine-user applies to connex-sim engines only, not --vllm")
		}
		d.EngineUser = &u
	}
	if *apiKeyFile != "" {
		data, err := os.ReadFile(*apiKeyFile)
		if err != nil {
			return flags{}, fmt.Errorf("--api-key-file: %w", err)
		}
		key, _, _ := strings.Cut(string(data), "\n")
		if d.APIKey = strings.TrimSpace(key); d.APIKey == "" {
			return flags{}, fmt.Errorf("--api-key-file %s: the first line is empty", *apiKeyFile)
		}
	}
	if *restartAfter < 0 {
		return flags{}, fmt.Errorf("--restart-after %s: must not be negative (0 turns restarts off)", *restartAfter)
	}
	d.Restart.After = *restartAfter
	return flags{opts: d, quiet: *quiet, envFile: *envFile, natsCLI: *natsCLI}, nil
}

// defaultEnvFile is where the env file's stable copy goes: a path a second
// shell can source without reading connex-up's output
// ($XDG_RUNTIME_DIR/connex-up.env, else the user's cache directory).
func defaultEnvFile() string {
	if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" {
		return filepath.Join(dir, "connex-up.env")
	}
	if dir, err := os.UserCacheDir(); err == nil {
		return filepath.Join(dir, "connex", "connex-up.env")
	}
	return ""
}

// parseUser reads "UID" or "UID:GID" (GID defaults to UID).
func parseUser(v string) (localcluster.User, error) {
	us, gs, hasGID := strings.Cut(v, ":")
	uid, err := strconv.ParseUint(us, 10, 32)
	if err != nil {
		return localcluster.User{}, fmt.Errorf("%q: want UID or UID:GID, numbers", v)
	}
	gid := uid
	if hasGID {
		if gid, err = strconv.ParseUint(gs, 10, 32); err != nil {
			return localcluster.User{}, fmt.Errorf("%q: want UID or UID:GID, numbers", v)
		}
	}
	return localcluster.User{UID: uint32(uid), GID: uint32(gid)}, nil
}
