package localcluster

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
)

// Options says what to start. Zero counts and empty strings take the
// defaults noted on each field; costs are passed as given (zero is free).
// Defaults returns Options with the costs `make run` uses.
type Options struct {
	// Connexd and Sim are the paths of the connexd and connex-sim binaries.
	Connexd string
	Sim     string

	// Prefill and Decode are how many engines of each role to start
	// (0 = 1 prefill, 2 decode).
	Prefill int
	Decode  int

	// Model is the served model name (default "connex-sim").
	Model string
	// Layout is the engines' KV layout: "small" (default) or "llama3-8b".
	Layout string
	// Blocks is each engine's KV block count (0 = connex-sim's default).
	Blocks int
	// PrefillPerToken is the simulated prefill cost of one prompt token
	// (passed to connex-sim in whole microseconds).
	PrefillPerToken time.Duration
	// DecodePerToken is the simulated time of one output token (passed to
	// connex-sim in whole milliseconds).
	DecodePerToken time.Duration
	// MaxModelLen bounds prompt plus output tokens (0 = connex-sim's default).
	MaxModelLen int

	// RouterHTTP is the router's HTTP listen address (default
	// "127.0.0.1:0": any free port; RouterURL says which).
	RouterHTTP string
	// NATSURL names an external NATS server (with JetStream); empty makes
	// the router's connexd embed one, listening on NATSListen.
	NATSURL string
	// NATSListen is the embedded server's address (default "127.0.0.1:0").
	NATSListen string
	// AuthDir is the authority an external NATSURL trusts (`connexd auth
	// init`): every process gets credentials minted from it. Empty with
	// NATSURL: no credentials. (An embedded server's authority is the
	// router's own.)
	AuthDir string
	// NATSURLFor, if set, gives the NATS URL node's processes use (the
	// router's is the server's own): a fault-injecting proxy in front of
	// the server, for partitions.
	NATSURLFor func(node, url string) string
	// ClusterPreset is every connexd's failure-detection preset (default
	// "local").
	ClusterPreset string
	// ConnexdArgs are extra flags for every connexd, the router's included
	// (e.g. "--kv-load-failure-policy", "recompute", "--retain-s", "5").
	ConnexdArgs []string
	// RouterArgs are extra flags for the router's connexd only.
	RouterArgs []string
	// APIKey, if set, is the key the router requires on /v1/* (passed in
	// a file, --api-key-file); clients send "Authorization: Bearer <key>".
	APIKey string
	// AdminKey is the key the router requires on /connex/v1/* and /metrics
	// (--admin-api-key-file); empty: a random one, which Cluster.AdminKey
	// returns. The cluster's own engine-list checks use it.
	AdminKey string
	// PrefillConnexdArgs and DecodeConnexdArgs are extra flags for the
	// connexd of each prefill / decode engine only.
	PrefillConnexdArgs []string
	DecodeConnexdArgs  []string
	// SimArgs are extra flags for every connex-sim.
	SimArgs []string
	// SimArgsFor, if set, gives extra flags for the connex-sim of engine
	// name (after SimArgs): engines of different shapes, e.g. "--tp", "2",
	// "--block-size", "32".
	SimArgsFor func(name string, role Role) []string
	// EngineUser, when set, runs each connex-sim under a uid and gid of
	// its own: this one plus the engine's index in start order (the
	// launcher must be root), so no engine reads another's engine.creds.
	// Its engine.creds is handed to that user
	// (0600), the cluster's directory made traversable (0711) but not
	// listable, and each connexd's member.creds stays 0600 and the
	// launcher's, so the engine cannot read it (docs/security.md "Engines under
	// their own uid"). Sim must be executable by that user.
	EngineUser *User
	// VLLM, when set, starts real `vllm serve` engines instead of
	// connex-sim (Sim is then unused, and Layout, Blocks and the costs do
	// not apply: the model decides them).
	VLLM *VLLM
	// LogLevel is every process's --log-level (default "warn").
	LogLevel string

	// Dir holds each connexd's data dir; empty makes a temporary one that
	// Close removes.
	Dir string
	// Log receives every process's output, one line at a time prefixed
	// with the process's name, and the cluster's own notes (exits); nil
	// discards them (the last lines of each process are still kept for
	// error messages and Logs).
	Log io.Writer
	// StartTimeout bounds each process's wait for its ready line and the
	// router's wait for readiness (default 30 s).
	StartTimeout time.Duration
	// StopTimeout is how long Close and Term wait after SIGTERM before
	// SIGKILL (default 10 s).
	StopTimeout time.Duration

	// Restart starts a process that exited without being asked to (a
	// crash, a kill -9; not Term, Restart or Close) again, only the part
	// that died ("decode-0/engine", "decode-0/connexd" or "router"), after
	// the policy's delay. The zero value never restarts: processes a test
	// or the chaos harness kills stay dead. `make run` uses
	// DefaultRestart.
	Restart RestartPolicy
	// OnRestart, if set, receives each step of an automatic restart (it
	// is called from the cluster's own goroutines); nil notes them in Log.
	OnRestart func(RestartEvent)
	// Metrics has every connexd, the router's included, serve Prometheus
	// metrics on a free loopback port (--metrics-listen 127.0.0.1:0; its
	// ready line says where). MetricsTargets lists them with the router's
	// and the engines' own.
	Metrics bool
}

// User is a uid and gid to run a process as.
type User struct {
	UID, GID uint32
}

// Defaults returns the cluster `make run` starts: one prefill and two
// decode engines on the small layout, 50 µs per prompt token and 20 ms per
// output token. Connexd and Sim are still to be set; connex-up adds
// Restart (DefaultRestart) and Metrics, which stay off here.
func Defaults() Options {
	return Options{
		Prefill:         1,
		Decode:          2,
		Model:           "connex-sim",
		Layout:          "small",
		PrefillPerToken: 50 * time.Microsecond,
		DecodePerToken:  20 * time.Millisecond,
	}
}

// withDefaults fills the zero fields and checks the rest.
func (o Options) withDefaults() (Options, error) {
	if o.Connexd == "" {
		return o, errors.New("localcluster: Options.Connexd (the connexd binary) is empty")
	}
	if o.VLLM != nil {
		v, err := o.VLLM.withDefaults()
		if err != nil {
			return o, err
		}
		o.VLLM = v
		if o.StartTimeout <= 0 {
			o.StartTimeout = vllmStartTimeout
		}
	} else if o.Sim == "" {
		return o, errors.New("localcluster: Options.Sim (the connex-sim binary) is empty")
	}
	if o.Prefill < 0 || o.Decode < 0 {
		return o, fmt.Errorf("localcluster: engine counts must not be negative (prefill=%d decode=%d)", o.Prefill, o.Decode)
	}
	if o.Prefill == 0 {
		o.Prefill = 1
	}
	if o.Decode == 0 {
		o.Decode = 2
	}
	if o.PrefillPerToken < 0 || o.DecodePerToken < 0 || o.Blocks < 0 || o.MaxModelLen < 0 {
		return o, errors.New("localcluster: costs, Blocks and MaxModelLen must not be negative")
	}
	o.Model = cmp.Or(o.Model, "connex-sim")
	o.Layout = cmp.Or(o.Layout, "small")
	o.RouterHTTP = cmp.Or(o.RouterHTTP, "127.0.0.1:0")
	o.NATSListen = cmp.Or(o.NATSListen, "127.0.0.1:0")
	o.ClusterPreset = cmp.Or(o.ClusterPreset, "local")
	o.LogLevel = cmp.Or(o.LogLevel, "warn")
	if o.AdminKey == "" {
		var b [16]byte
		_, _ = rand.Read(b[:])
		o.AdminKey = "connex-admin-" + hex.EncodeToString(b[:])
	}
	if o.StartTimeout <= 0 {
		o.StartTimeout = 30 * time.Second
	}
	if o.StopTimeout <= 0 {
		o.StopTimeout = 10 * time.Second
	}
	if o.Restart.After < 0 || o.Restart.Max < 0 || o.Restart.Stable < 0 {
		return o, fmt.Errorf("localcluster: Restart's durations must not be negative (%+v)", o.Restart)
	}
	return o, nil
}

// routerArgs are the router connexd's flags. natsListen and httpListen are
// passed separately so a restart can pin the ports the first run got.
func (o Options) routerArgs(dataDir, natsListen, httpListen string) []string {
	args := []string{
		"--role", "router",
		"--member-id", RouterName,
		"--http-listen", httpListen,
		"--data-dir", dataDir,
		"--cluster-preset", o.ClusterPreset,
		"--log-level", o.LogLevel,
	}
	if o.Metrics {
		args = append(args, "--metrics-listen", "127.0.0.1:0")
	}
	if o.NATSURL != "" {
		args = append(args, "--nats-url", o.NATSURL)
	} else {
		args = append(args, "--nats-listen", natsListen)
	}
	args = append(args, o.ConnexdArgs...)
	return append(args, o.RouterArgs...)
}

// engineConnexdArgs are the flags of the connexd bound to engine name.
func (o Options) engineConnexdArgs(name string, role Role, natsURL, dataDir string) []string {
	args := []string{
		"--role", string(role),
		"--member-id", name,
		"--nats-url", natsURL,
		"--data-dir", dataDir,
		"--cluster-preset", o.ClusterPreset,
		"--log-level", o.LogLevel,
	}
	if o.Metrics {
		args = append(args, "--metrics-listen", "127.0.0.1:0")
	}
	args = append(args, o.ConnexdArgs...)
	if role == RolePrefill {
		return append(args, o.PrefillConnexdArgs...)
	}
	return append(args, o.DecodeConnexdArgs...)
}

// simArgs are the flags of engine name's connex-sim.
func (o Options) simArgs(name string, role Role, natsURL string) []string {
	args := []string{
		"--role", string(role),
		"--nats", natsURL,
		"--member", name,
		"--engine-id", name,
		"--listen", "127.0.0.1:0",
		"--model", o.Model,
		"--layout", o.Layout,
		"--prefill-us-per-token", strconv.FormatInt(o.PrefillPerToken.Microseconds(), 10),
		"--decode-ms-per-token", strconv.FormatInt(o.DecodePerToken.Milliseconds(), 10),
		"--log-level", o.LogLevel,
	}
	if o.Blocks > 0 {
		args = append(args, "--blocks", strconv.Itoa(o.Blocks))
	}
	if o.MaxModelLen > 0 {
		args = append(args, "--max-model-len", strconv.Itoa(o.MaxModelLen))
	}
	args = append(args, o.SimArgs...)
	if o.SimArgsFor != nil {
		args = append(args, o.SimArgsFor(name, role)...)
	}
	return args
}
