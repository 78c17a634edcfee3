// Command connex-up brings up a local prefill/decode Connex cluster — the
// router (connexd --role router, embedding NATS) and, per engine, a connexd
// plus a connex-sim simulated engine — prints how to send it a streamed
// completion and how to kill a decode engine to watch the stream resume,
// and stops every process it started on Ctrl-C (SIGINT) or SIGTERM.
// `make run` builds the binaries and runs it. It builds nothing itself.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/connex/connex/localcluster"
	"github.com/spf13/pflag"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	o, quiet, err := parseFlags(args, stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "connex-up: %v\n", err)
		return 2
	}
	if !quiet {
		o.Log = stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(stdout, "connex-up: starting the router, %d prefill and %d decode engines…\n", o.Prefill, o.Decode)
	c, err := localcluster.Start(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "connex-up: %v\n", err)
		return 1
	}
	fmt.Fprint(stdout, banner(c, o))
	<-ctx.Done()
	stop() // a second Ctrl-C ends connex-up at once; the kernel's parent-death signal still stops the children
	fmt.Fprintln(stdout, "\nconnex-up: stopping every process…")
	if err := c.Close(); err != nil {
		fmt.Fprintf(stderr, "connex-up: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, "connex-up: stopped")
	return 0
}

// parseFlags reads connex-up's flags into cluster options; quiet drops the
// processes' own log lines.
func parseFlags(args []string, stderr io.Writer) (localcluster.Options, bool, error) {
	d := localcluster.Defaults()
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
	logLevel := fs.String("log-level", "warn", "every process's log level: debug, info, warn or error")
	dir := fs.String("dir", "", "directory for the connexds' data (default: a temporary one, removed at exit)")
	quiet := fs.Bool("quiet", false, "do not show the processes' log lines")
	vllmBin := fs.String("vllm", "", "run real `vllm serve` engines with this vllm command instead of connex-sim (make run-vllm sets it up)")
	vllmModel := fs.String("vllm-model", "", "with --vllm: the model directory to serve (--model is its served name)")
	vllmMaxLen := fs.Int("vllm-max-model-len", 4096, "with --vllm: vllm serve --max-model-len")
	vllmPolicy := fs.String("kv-load-failure-policy", "fail", "with --vllm: vLLM's kv_load_failure_policy on decode engines, fail or recompute")
	engineUser := fs.String("engine-user", "", "run every connex-sim as UID[:GID] (as root; the engines then read no connexd's member.creds, README \"Engines under their own uid\"); --sim must be executable by that user")
	apiKeyFile := fs.String("api-key-file", "", "file whose first line is the API key the router then requires on /v1/* (default: none)")
	if err := fs.Parse(args); err != nil {
		return d, false, err
	}
	if fs.NArg() > 0 {
		return d, false, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *prefill < 1 || *decode < 1 {
		return d, false, fmt.Errorf("--prefill and --decode must be at least 1 (got %d and %d)", *prefill, *decode)
	}
	if *prefillUS < 0 || *decodeMS < 0 {
		return d, false, errors.New("--prefill-us-per-token and --decode-ms-per-token must not be negative")
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
	if *vllmBin != "" {
		d.VLLM = &localcluster.VLLM{Bin: *vllmBin, Model: *vllmModel, MaxModelLen: *vllmMaxLen, LoadFailurePolicy: *vllmPolicy}
	} else if *vllmModel != "" {
		return d, false, errors.New("--vllm-model needs --vllm")
	}
	if *engineUser != "" {
		u, err := parseUser(*engineUser)
		if err != nil {
			return d, false, fmt.Errorf("--engine-user: %w", err)
		}
		if d.VLLM != nil {
			return d, false, errors.New("--engine-user applies to connex-sim engines only, not --vllm")
		}
		d.EngineUser = &u
	}
	if *apiKeyFile != "" {
		data, err := os.ReadFile(*apiKeyFile)
		if err != nil {
			return d, false, fmt.Errorf("--api-key-file: %w", err)
		}
		key, _, _ := strings.Cut(string(data), "\n")
		if d.APIKey = strings.TrimSpace(key); d.APIKey == "" {
			return d, false, fmt.Errorf("--api-key-file %s: the first line is empty", *apiKeyFile)
		}
	}
	return d, *quiet, nil
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

// banner is what a user reads once the cluster is ready.
func banner(c *localcluster.Cluster, o localcluster.Options) string {
	pids := c.PIDs()
	s := fmt.Sprintf("\nconnex-up: ready — router %s (pid %d), NATS %s\n", c.RouterURL(), pids[localcluster.RouterName], c.NATSURL())
	var decode []localcluster.Engine
	for _, e := range c.Engines() {
		s += fmt.Sprintf("  %-10s engine %s (pid %d), connexd pid %d\n", e.Name, e.URL, e.EnginePID, e.ConnexdPID)
		if e.Role == localcluster.RoleDecode {
			decode = append(decode, e)
		}
	}
	engine, pace := "connex-sim", fmt.Sprintf("300 tokens at %s each", o.DecodePerToken)
	tokens, kill := 300, "kill -9 %d"
	if o.VLLM != nil {
		// A vllm serve is a process group (API server and engine core).
		engine, pace, tokens, kill = "vllm serve", "greedy, from a real vLLM", 3000, "kill -9 -- -%d"
	}
	auth := ""
	if o.APIKey != "" {
		auth = ` -H "Authorization: Bearer $(head -1 <your --api-key-file>)"`
	}
	s += fmt.Sprintf(`
A streamed completion (%s):
  curl -N -i %s/v1/completions%s -H 'Content-Type: application/json' \
    -d '{"model":"%s","prompt":"Once upon a time","max_tokens":%d,"stream":true}'

Watch a resume: while it streams, kill the decode engine serving it (the X-Connex-Decode-Engine
header names it); the stream carries on from another decode engine, with no second prefill:
`, pace, c.RouterURL(), auth, o.Model, tokens)
	for _, e := range decode {
		s += fmt.Sprintf("  "+kill+"    # %s's %s\n", e.EnginePID, e.Name, engine)
	}
	s += fmt.Sprintf("\nThe router's engines and metrics take its admin key (written to %s):\n  curl -H \"Authorization: Bearer $(cat %s)\" %s/connex/v1/engines\n",
		c.AdminKeyFile(), c.AdminKeyFile(), c.RouterURL())
	creds := ""
	if f := c.AdminCreds(); f != "" {
		creds = " --creds " + f
	}
	s += fmt.Sprintf("\nEvery member, engine, hold and request:\n  %s status --nats-url %s%s\n", o.Connexd, c.NATSURL(), creds)
	if creds != "" {
		s += fmt.Sprintf("The bus is authenticated; the nats CLI takes the same file:\n  nats -s %s --creds %s micro ls\n", c.NATSURL(), c.AdminCreds())
	}
	return s + "\nCtrl-C stops every process.\n"
}
