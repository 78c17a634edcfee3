package localcluster

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// VLLM says how to start real `vllm serve` engines (vLLM's CPU build with the
// ConnexConnector from engine/vllm-connector/) instead of connex-sim. Each
// engine is one `vllm serve` process group (its API server and engine core)
// with a connexd beside it, as in production; the connector registers the
// engine with that connexd, so the router finds it through membership.
type VLLM struct {
	// Bin is the `vllm` command of a Python environment that holds vLLM and
	// the connex_vllm package (engine/vllm-connector/vllm-cpu/install.sh
	// makes one).
	Bin string
	// Model is the model directory to serve (engine/vllm-connector/vllm-cpu/make_model.py
	// makes the tiny one the tests use); Options.Model is its served name.
	Model string
	// MaxModelLen is --max-model-len (default 512).
	MaxModelLen int
	// KVCacheGiB is each engine's KV cache (VLLM_CPU_KVCACHE_SPACE, default 1).
	KVCacheGiB int
	// LoadFailurePolicy is vLLM's kv_load_failure_policy on decode engines:
	// "fail" (default) or "recompute".
	LoadFailurePolicy string
	// PolicyFor overrides LoadFailurePolicy for the engines it names
	// (e.g. {"decode-1": "recompute"}).
	PolicyFor map[string]string
	// Args are extra `vllm serve` flags for every engine.
	Args []string
	// ArgsFor are extra `vllm serve` flags for the engines it names, after
	// Args (e.g. {"prefill-0": {"--block-size", "64"}}: engines of other
	// block sizes, whose pulls connexd translates).
	ArgsFor map[string][]string
	// PrefillTP and DecodeTP are the tensor-parallel sizes of the engines
	// of each role (default 1): `--tensor-parallel-size N`, one worker
	// process per rank, each rank's OpenMP thread bound to a core of its own
	// (wrapping around the machine's cores) and each backed by a connexd
	// region of its own.
	PrefillTP, DecodeTP int
	// TPFor overrides PrefillTP and DecodeTP for the engines it names.
	TPFor map[string]int
	// Env are extra environment variables (KEY=VALUE) for every engine.
	Env []string
	// NoDecodePrefixCaching runs decode engines with vLLM's prefix caching
	// off (on by default: a request whose prefix a decode engine caches
	// pulls only the rest of its hold). Prefill engines always run without
	// it, so that every prefill computes and holds the whole prompt.
	NoDecodePrefixCaching bool
	// LogDir, when set, takes each engine's own output (vLLM's log lines)
	// off Options.Log into LogDir/<engine>.log (EngineLogPath): truncated at
	// the cluster's start, appended across the engine's restarts, kept
	// after Close. The last lines are still kept for error messages.
	LogDir string
	// Connector are extra ConnexConnector settings (kv_connector_extra_config,
	// e.g. {"progress_every": 64}) for every engine; the member, NATS and
	// base_url settings are the cluster's and cannot be overridden here.
	Connector map[string]any
}

// vllmStartTimeout is the default start bound with real engines: loading
// vLLM and its model takes about a minute per engine on a 2-core machine,
// and the engines start together.
const vllmStartTimeout = 6 * time.Minute

func (v *VLLM) withDefaults() (*VLLM, error) {
	if v.Bin == "" {
		return nil, errors.New("localcluster: VLLM.Bin (the vllm command) is empty")
	}
	if v.Model == "" {
		return nil, errors.New("localcluster: VLLM.Model (the model directory) is empty")
	}
	if _, err := os.Stat(filepath.Join(v.Model, "config.json")); err != nil {
		return nil, fmt.Errorf("localcluster: VLLM.Model %s holds no model (engine/vllm-connector/vllm-cpu/make_model.py makes one): %w", v.Model, err)
	}
	out := *v
	out.MaxModelLen = cmp.Or(out.MaxModelLen, 512)
	out.KVCacheGiB = cmp.Or(out.KVCacheGiB, 1)
	out.LoadFailurePolicy = cmp.Or(out.LoadFailurePolicy, "fail")
	if p := out.LoadFailurePolicy; p != "fail" && p != "recompute" {
		return nil, fmt.Errorf("localcluster: VLLM.LoadFailurePolicy %q: want fail or recompute", p)
	}
	out.PrefillTP, out.DecodeTP = cmp.Or(out.PrefillTP, 1), cmp.Or(out.DecodeTP, 1)
	for name, tp := range out.TPFor {
		if tp < 1 || tp > 64 {
			return nil, fmt.Errorf("localcluster: VLLM.TPFor[%s] %d: want 1..64", name, tp)
		}
	}
	for role, tp := range map[Role]int{RolePrefill: out.PrefillTP, RoleDecode: out.DecodeTP} {
		if tp < 1 || tp > 64 {
			return nil, fmt.Errorf("localcluster: VLLM %s tensor-parallel size %d: want 1..64", role, tp)
		}
	}
	for name, p := range out.PolicyFor {
		if p != "fail" && p != "recompute" {
			return nil, fmt.Errorf("localcluster: VLLM.PolicyFor[%s] %q: want fail or recompute", name, p)
		}
	}
	return &out, nil
}

// kvTransferConfig is the --kv-transfer-config of engine name: the
// ConnexConnector in role's kv_role, talking to the connexd beside it.
func (v *VLLM) kvTransferConfig(name string, role Role, natsURL, baseURL, creds string) (string, error) {
	kvRole := "kv_consumer"
	if role == RolePrefill {
		kvRole = "kv_producer"
	}
	extra := map[string]any{}
	for k, v := range v.Connector {
		extra[k] = v
	}
	extra["member"], extra["nats_url"], extra["base_url"] = name, natsURL, baseURL
	if creds != "" {
		extra["nats_creds"] = creds
	}
	cfg := map[string]any{
		"kv_connector":              "ConnexConnector",
		"kv_connector_module_path":  "connex_vllm",
		"kv_role":                   kvRole,
		"engine_id":                 name,
		"kv_load_failure_policy":    cmp.Or(v.PolicyFor[name], v.LoadFailurePolicy),
		"kv_connector_extra_config": extra,
	}
	b, err := json.Marshal(cfg)
	return string(b), err
}

// serveArgs are the `vllm serve` flags of engine name listening on port.
func (v *VLLM) serveArgs(name string, role Role, served string, port int, kvConfig string) []string {
	args := []string{
		"serve", v.Model,
		"--served-model-name", served,
		"--host", "127.0.0.1",
		"--port", strconv.Itoa(port),
		// fp32 and eager mode: greedy output is then the same across
		// engines, restarts and batch shapes (what resume relies on).
		"--dtype", "float32",
		"--enforce-eager",
		"--max-model-len", strconv.Itoa(v.MaxModelLen),
		"--kv-transfer-config", kvConfig,
	}
	// A prefill-side prefix-cache hit would hide a second prefill; a
	// decode-side one makes the connector pull only the hold's blocks past
	// it.
	if role == RolePrefill || v.NoDecodePrefixCaching {
		args = append(args, "--no-enable-prefix-caching")
	} else {
		args = append(args, "--enable-prefix-caching")
	}
	if tp := v.tp(name, role); tp > 1 {
		args = append(args, "--tensor-parallel-size", strconv.Itoa(tp))
	}
	args = append(args, v.Args...)
	return append(args, v.ArgsFor[name]...)
}

// tp is engine name's tensor-parallel size.
func (v *VLLM) tp(name string, role Role) int {
	if tp, ok := v.TPFor[name]; ok {
		return tp
	}
	if role == RolePrefill {
		return v.PrefillTP
	}
	return v.DecodeTP
}

// env is engine index i's environment (of tensor-parallel size tp):
// offline model loading, loopback-only internal queues, its KV cache size,
// and one OpenMP thread per rank, each bound to one core (the same thread
// count everywhere keeps float reductions, and so greedy output, identical
// between engines of one TP size).
func (v *VLLM) env(i, tp int) []string {
	e := append(childEnv(),
		"HF_HUB_OFFLINE=1",
		"VLLM_HOST_IP=127.0.0.1",
		"VLLM_NO_USAGE_STATS=1",
		"DO_NOT_TRACK=1",
		"TOKENIZERS_PARALLELISM=false",
		"VLLM_CPU_KVCACHE_SPACE="+strconv.Itoa(v.KVCacheGiB),
		"VLLM_CPU_OMP_THREADS_BIND="+threadsBind(i, tp, runtime.NumCPU()),
	)
	return append(e, v.Env...)
}

// threadsBind is VLLM_CPU_OMP_THREADS_BIND for engine index i of
// tensor-parallel size tp on a machine of cpus cores: rank r's one thread on
// core (i + r) mod cpus, ranks separated by '|' as vLLM's CPU worker reads
// them.
func threadsBind(i, tp, cpus int) string {
	cores := make([]string, max(tp, 1))
	for r := range cores {
		cores[r] = strconv.Itoa((i + r) % max(cpus, 1))
	}
	return strings.Join(cores, "|")
}

// freePort asks the kernel for a free loopback TCP port. Another process
// could take it before vLLM binds it; vLLM then fails at start and says so.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("localcluster: free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startVLLM starts engine name's `vllm serve` and waits for its /health.
func (c *Cluster) startVLLM(ctx context.Context, n *node, index int, natsURL string) (*process, string, error) {
	v := c.opts.VLLM
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	dataDir := filepath.Join(c.dir, n.name)
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return nil, "", fmt.Errorf("localcluster: %s data dir: %w", n.name, err)
	}
	flags, err := c.creds("--nats-creds", filepath.Join(dataDir, "engine.creds"), "--role", "engine", "--member", n.name, "--engine", n.name)
	if err != nil {
		return nil, "", err
	}
	creds := ""
	if len(flags) == 2 {
		creds = flags[1]
	}
	kv, err := v.kvTransferConfig(n.name, n.role, natsURL, base, creds)
	if err != nil {
		return nil, "", fmt.Errorf("localcluster: %s kv-transfer-config: %w", n.name, err)
	}
	log, err := c.engineLog(n.name)
	if err != nil {
		return nil, "", err
	}
	p, err := startProcessEnv(processName(n.name, PartEngine), v.Bin, v.serveArgs(n.name, n.role, c.opts.Model, port, kv), "", log, v.env(index, v.tp(n.name, n.role)))
	if err != nil {
		return nil, "", err
	}
	if log != c.log { // its exit is news for the screen, not only for its file
		p.mu.Lock()
		p.notes = c.log
		p.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(ctx, c.opts.StartTimeout)
	defer cancel()
	if err := pollReady(ctx, base+"/health", time.Second, p.exited); err != nil {
		return p, "", fmt.Errorf("localcluster: %s (vllm serve) not ready: %w; last output:\n%s", n.name, err, p.logs())
	}
	return p, base, nil
}
