// Package config loads connexd's configuration from, in increasing order of
// precedence: built-in defaults, a YAML file, CONNEX_* environment variables
// and command-line flags. Invalid values fail at start with a message that
// names the key and the allowed values.
package config

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"github.com/spf13/viper"
)

// ErrInvalid wraps every validation failure.
var ErrInvalid = errors.New("config: invalid")

// Config is connexd's validated configuration.
type Config struct {
	// Backend is the data plane: "ucx", "tcp" or "auto" (UCX where the
	// binary has it and libucp loads, else TCP).
	Backend string
	// UCXReads is how peers read memory registered with the UCX backend:
	// "checked" (the holder's CPU checks every request and copies the
	// bytes; revocable) or "onesided" (readers on the same host copy with
	// process_vm_readv, elsewhere with ucp_get_nbx; faster, not revocable,
	// safe only under the lease protocol). See transport/ucx's doc.
	UCXReads string
	// UCXSharedReads is how this member, as a reader, reads holds in
	// regions a connexd on this host created (UCX shared memory): "map"
	// (copy from UCX's mapping of the holder's segment on every core; the
	// default) or "get" (ucp_get_nbx on the UCX owner thread: the same
	// copy, one GET at a time, for comparison or if mapped copies misbehave).
	UCXSharedReads string
	// Release is "on_finish" (keep blocks until released or expired) or
	// "after_pull" (free after the first successful pull).
	Release string
	// Retain is the lease length; every pull and keep-alive renews it.
	Retain time.Duration
	// Claim is how long a new hold waits for a decode engine's first pull,
	// renewal or binding before it is freed as unclaimed (0: off, the hold
	// lives Retain). See lease.Config.Claim.
	Claim time.Duration
	// KVLoadFailurePolicy is "fail" or "recompute", passed to decode engines.
	KVLoadFailurePolicy string
	// NATSURL is the NATS server or cluster to use; empty starts an
	// embedded server.
	NATSURL string
	// NATSListen is the embedded server's client address (host:port; port
	// 0 picks a free one).
	NATSListen string
	// DataDir holds the embedded server's JetStream storage.
	DataDir string
	// NATSAuth turns authentication on for the embedded server ("on", the
	// default) or off ("off": any process that reaches nats_listen may
	// call every API, read every notice and write the request bucket; for
	// development only, and connexd says so at every start).
	NATSAuth bool
	// AuthDir holds the authority keys the embedded server trusts and the
	// credentials connexd writes there (admin.creds); default
	// <data_dir>/auth.
	AuthDir string
	// NATSCreds is this member's credentials file for an external server
	// with authentication (`connexd auth creds --role member --member <id>`).
	NATSCreds string
	// NATSTLSCA, NATSTLSCert and NATSTLSKey: the CA that verifies the NATS
	// server, and the certificate this client presents (or, embedded, the
	// certificate the server serves).
	NATSTLSCA, NATSTLSCert, NATSTLSKey string
	// DataTLS says whether the TCP data plane speaks mutual TLS: with the
	// nats_tls_* certificate and CA when they are set, else with a
	// certificate made from the member's NATS credentials (as
	// cluster_tls): "auto" (when either exists: the default with
	// nats_auth on), "on" or "off".
	DataTLS string
	// RegionDir confines region.register: only regular files beneath it,
	// reached without symbolic links, owned by RegionOwners.
	RegionDir string
	// RegionOwners are the uids whose files region.register accepts
	// (empty: connexd's own).
	RegionOwners []int
	// RegionMaxBytes bounds the bytes of all regions this member maps (0:
	// three quarters of the machine's memory); RegionMaxBytesPerEngine
	// those of one engine (0: RegionMaxBytes); RegionMaxPerEngine how many
	// regions one engine may have.
	RegionMaxBytes          uint64
	RegionMaxBytesPerEngine uint64
	RegionMaxPerEngine      int
	// HoldsMaxPerEngine bounds the live holds of one engine.
	HoldsMaxPerEngine int
	// RequestsMax bounds the requests in flight on this member.
	RequestsMax int
	// NATSMaxConnections bounds the embedded server's client connections
	// (at most half the descriptor limit); engines together hold at most
	// three quarters of them, so members always find room.
	NATSMaxConnections int
	// NATSEngineConnections bounds the connections of one engine identity
	// on the embedded server with authentication.
	NATSEngineConnections int
	// RequestStoreBytes bounds the request bucket's JetStream storage.
	RequestStoreBytes int64
	// EngineURLHosts are host names an engine's base_url may name beside
	// this machine's own addresses ("*": any host).
	EngineURLHosts []string
	// RequestsMaxPerEngine bounds one engine's live requests on this
	// member.
	RequestsMaxPerEngine int
	// RequestBytesPerEngine bounds the bytes one engine's requests store in
	// the request bucket through this member (0 in the file: an eighth of
	// request_store_bytes; Load fills it in).
	RequestBytesPerEngine int64
	// ShmDir, if set, is where connexd allocates the memory of created
	// regions (region.create): a tmpfs mounted with huge=always gives them
	// 2 MiB pages. Empty: a memfd (and UCX's UCX_POSIX_DIR or /dev/shm).
	ShmDir string
	// RegionSocket is where engines receive the descriptors of created
	// regions (kvmem/handover): a path, "@name" (Linux's abstract
	// namespace), empty for a unique abstract name, or "off" (engines then
	// map /proc/<pid>/fd/<n>, which only connexd's own uid can open).
	RegionSocket string
	// Role is this member's role: prefill, decode, router or all.
	Role string
	// MemberID names this connexd on the subject API and in the cluster.
	MemberID string
	// DataListen is where the TCP data plane listens.
	DataListen string
	// DataAdvertise, if set, is the host:port peers use to reach the TCP
	// data plane (when data_listen is a wildcard or behind NAT).
	DataAdvertise string
	// JSReplicas is the JetStream replication factor of the request bucket
	// (1 for a single NATS server, 3 for a NATS cluster).
	JSReplicas int
	// RequestTTL is how long a request's durable state lives after its
	// last write (request_ttl_s).
	RequestTTL time.Duration
	// PullTimeout bounds one pull end to end.
	PullTimeout time.Duration
	// PullStall is how long a pull may make no progress (no batch of reads
	// completes, or the holder does not answer) before it fails: a dead or
	// frozen holder is detected within this time.
	PullStall time.Duration
	// MaxRequestBytes bounds one API request payload.
	MaxRequestBytes int
	// Tombstone is how long ended transfers are remembered, so late
	// callers get "expired"/"released" rather than "unknown transfer".
	Tombstone time.Duration
	// ClusterPreset picks failure-detection timings: local (one machine:
	// crash seen in ~0.1 s, hang after 1 s), lan (crash ~0.6 s, hang 5 s)
	// or wan.
	ClusterPreset string
	// ClusterName is the protoactor cluster name (one NATS token).
	ClusterName string
	// ClusterHost is the address protoactor's remote listens on and
	// advertises; the port is picked at start.
	ClusterHost string
	// ClusterTLS says whether protoactor's remote speaks mutual TLS with
	// certificates made from this member's NATS credentials (only members
	// of the same authority complete the handshake): "auto" (when the
	// member has credentials: the embedded server with nats_auth on, or
	// nats_creds), "on" or "off".
	ClusterTLS string
	// OrphanScan is how often the coordinator rescans for requests whose
	// owner left while something may be pending (after a membership
	// change, a failed pass, adoptions asked), besides reacting to
	// membership changes at once.
	OrphanScan time.Duration
	// OrphanIdleScan is how often it rescans once a pass found nothing
	// pending (requests.ScanPace); at least OrphanScan.
	OrphanIdleScan time.Duration
	// LogLevel is debug, info, warn or error.
	LogLevel slog.Level
	// MetricsListen, if set, is where connexd serves Prometheus metrics
	// (GET /metrics); empty turns them off.
	MetricsListen string
	// PprofListen, if set, is where connexd serves Go's profiles
	// (/debug/pprof/: CPU, heap, goroutines, mutex and block) for an
	// operator chasing where its time goes; empty (the default) turns them
	// off. It has no authentication: bind it to a loopback address.
	PprofListen string
	// HTTPListen is where a router member serves its OpenAI-compatible HTTP
	// API (role router or all).
	HTTPListen string
	// RouterStall is a decode stream's stall window while its pace is not
	// known yet (its first 4 gaps), and the least a silent engine that
	// answers its health probe is given (router.StallRule.Cold).
	RouterStall time.Duration
	// RouterStallFactor scales a stream's longest recent inter-token gap
	// into its stall window (router.StallRule.Factor).
	RouterStallFactor int
	// RouterStallFloor and RouterStallCeiling bound a stream's stall window
	// (router.StallRule.Floor, Ceiling).
	RouterStallFloor, RouterStallCeiling time.Duration
	// RouterFirstToken bounds the wait for a decode engine's first token
	// (it includes the KV pull and the recompute of resumed tokens).
	RouterFirstToken time.Duration
	// RouterPrefillTimeout bounds the prefill leg.
	RouterPrefillTimeout time.Duration
	// RouterMaxResumes is how many times one request may move to another
	// decode engine before it fails.
	RouterMaxResumes int
	// RouterAssignSeed ("on" or "off") says whether the router gives a
	// sampled request that resumes only by replay a random seed of its own
	// (router.Config.NoAssignSeed).
	RouterAssignSeed string
	// RouterMaxBodyBytes bounds a client request body.
	RouterMaxBodyBytes int
	// RouterReadHeaderTimeout, RouterReadTimeout and RouterIdleTimeout
	// bound a client's headers, its whole request, and an idle keep-alive
	// connection.
	RouterReadHeaderTimeout, RouterReadTimeout, RouterIdleTimeout time.Duration
	// RouterMaxConns caps the router's open client connections.
	RouterMaxConns int
	// RouterGOGC is the Go garbage collector's GOGC for a router process
	// (role router; the GOGC environment variable, when set, wins): its live
	// heap is small and every request allocates, so collecting less often
	// saves CPU per request for some memory.
	RouterGOGC int
	// RouterMaxInFlight caps the completions the router serves at once
	// (more: 503 overloaded with Retry-After).
	RouterMaxInFlight int
	// APIKeys, if any, are required on the router's /v1/* (from api_key,
	// comma-separated, and api_key_file, one per line).
	APIKeys []string
	// AdminKeys, if any, are required on the router's /connex/v1/* and
	// /metrics (admin_api_key, admin_api_key_file).
	AdminKeys []string
}

// Flags returns the flag set connexd parses: --config plus one flag per key.
func Flags(name string) *pflag.FlagSet {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	fs.String("config", "", "YAML configuration file")
	for _, d := range defaults {
		flag := strings.ReplaceAll(d.key, "_", "-")
		switch v := d.value.(type) {
		case int:
			fs.Int(flag, v, d.usage)
		case string:
			fs.String(flag, v, d.usage)
		}
	}
	return fs
}

// Load parses args and builds a validated Config. env is the process
// environment (os.Environ() in connexd), passed in so tests need not mutate it.
func Load(args []string, env []string) (Config, error) {
	fs := Flags("connexd")
	if err := fs.Parse(args); err != nil {
		return Config{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if fs.NArg() > 0 {
		// "connexd stauts" or "connexd retain_s=5" must not start a
		// daemon on the defaults.
		return Config{}, fmt.Errorf("%w: unexpected argument %q: settings are flags (--retain-s=5); connexd's subcommands are status and auth", ErrInvalid, fs.Arg(0))
	}
	v := viper.New()
	for _, d := range defaults {
		v.SetDefault(d.key, d.value)
		if f := fs.Lookup(strings.ReplaceAll(d.key, "_", "-")); f != nil && f.Changed {
			v.Set(d.key, f.Value.String())
		}
	}
	if path, _ := fs.GetString("config"); path != "" {
		v.SetConfigFile(path)
		v.SetConfigType("yaml")
		if err := v.ReadInConfig(); err != nil {
			return Config{}, fmt.Errorf("%w: read %s: %w", ErrInvalid, path, err)
		}
		for _, k := range v.AllKeys() {
			if !known(k) {
				return Config{}, fmt.Errorf("%w: %s: unknown key %q", ErrInvalid, path, k)
			}
			switch v.Get(k).(type) {
			case []any, map[string]any:
				// viper reads a list or a map as "" for a string key:
				// api_key: [k1, k2] would leave the router open.
				return Config{}, fmt.Errorf("%w: %s: %s must be a single value, not a list or a map (several API keys: one comma-separated string, or api_key_file)", ErrInvalid, path, k)
			}
		}
	}
	for _, kv := range env {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, "CONNEX_") {
			continue
		}
		key := strings.ToLower(strings.TrimPrefix(name, "CONNEX_"))
		if !known(key) {
			continue
		}
		if f := fs.Lookup(strings.ReplaceAll(key, "_", "-")); f != nil && f.Changed {
			continue // flags win over the environment
		}
		v.Set(key, val)
	}
	return build(v)
}

func known(key string) bool {
	for _, d := range defaults {
		if d.key == key {
			return true
		}
	}
	return false
}

func oneOf(v *viper.Viper, key string, allowed ...string) (string, error) {
	s := strings.TrimSpace(v.GetString(key))
	for _, a := range allowed {
		if s == a {
			return s, nil
		}
	}
	return "", fmt.Errorf("%w: %s=%q, allowed: %s", ErrInvalid, key, s, strings.Join(allowed, ", "))
}

// positive reads key as an integer in 1..max.
func positive(v *viper.Viper, key string, max int) (int, error) {
	raw := strings.TrimSpace(v.GetString(key))
	var n int
	if _, err := fmt.Sscan(raw, &n); err != nil || fmt.Sprint(n) != raw || n <= 0 || n > max {
		return 0, fmt.Errorf("%w: %s=%q, allowed: an integer in 1..%d", ErrInvalid, key, raw, max)
	}
	return n, nil
}

var memberIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func build(v *viper.Viper) (Config, error) {
	var c Config
	var err error
	if c.Backend, err = oneOf(v, "backend", "auto", "ucx", "tcp"); err != nil {
		return c, err
	}
	if c.UCXReads, err = oneOf(v, "ucx_reads", "checked", "onesided"); err != nil {
		return c, err
	}
	if c.UCXSharedReads, err = oneOf(v, "ucx_shared_reads", "map", "get"); err != nil {
		return c, err
	}
	if c.Release, err = oneOf(v, "release", "on_finish", "after_pull"); err != nil {
		return c, err
	}
	if c.KVLoadFailurePolicy, err = oneOf(v, "kv_load_failure_policy", "fail", "recompute"); err != nil {
		return c, err
	}
	if c.Role, err = oneOf(v, "role", "prefill", "decode", "router", "all"); err != nil {
		return c, err
	}
	retain, err := positive(v, "retain_s", 24*3600)
	if err != nil {
		return c, err
	}
	c.Retain = time.Duration(retain) * time.Second
	if raw := strings.TrimSpace(v.GetString("claim_s")); raw != "0" {
		claim, err := positive(v, "claim_s", 24*3600)
		if err != nil {
			return c, fmt.Errorf("%w (0 turns the claim deadline off)", err)
		}
		c.Claim = time.Duration(claim) * time.Second
	}
	pt, err := positive(v, "pull_timeout_ms", 3600*1000)
	if err != nil {
		return c, err
	}
	c.PullTimeout = time.Duration(pt) * time.Millisecond
	ps, err := positive(v, "pull_stall_ms", 3600*1000)
	if err != nil {
		return c, err
	}
	c.PullStall = time.Duration(ps) * time.Millisecond
	if c.MaxRequestBytes, err = positive(v, "max_request_bytes", 64<<20); err != nil {
		return c, err
	}
	ts, err := positive(v, "tombstone_s", 7*24*3600)
	if err != nil {
		return c, err
	}
	c.Tombstone = time.Duration(ts) * time.Second
	if c.ClusterPreset, err = oneOf(v, "cluster_preset", "local", "lan", "wan"); err != nil {
		return c, err
	}
	c.ClusterName = strings.TrimSpace(v.GetString("cluster_name"))
	if !memberIDRe.MatchString(c.ClusterName) {
		return c, fmt.Errorf("%w: cluster_name=%q, allowed: 1-64 letters, digits, '-' or '_'", ErrInvalid, c.ClusterName)
	}
	c.ClusterHost = strings.TrimSpace(v.GetString("cluster_host"))
	scan, err := positive(v, "orphan_scan_ms", 3600*1000)
	if err != nil {
		return c, err
	}
	c.OrphanScan = time.Duration(scan) * time.Millisecond
	idleScan, err := positive(v, "orphan_idle_scan_ms", 24*3600*1000)
	if err != nil {
		return c, err
	}
	if idleScan < scan {
		return c, fmt.Errorf("%w: orphan_idle_scan_ms=%d is below orphan_scan_ms=%d: the idle rescan is the slower one", ErrInvalid, idleScan, scan)
	}
	c.OrphanIdleScan = time.Duration(idleScan) * time.Millisecond
	lvl, err := oneOf(v, "log_level", "debug", "info", "warn", "error")
	if err != nil {
		return c, err
	}
	_ = c.LogLevel.UnmarshalText([]byte(lvl))
	c.MetricsListen = strings.TrimSpace(v.GetString("metrics_listen"))
	c.PprofListen = strings.TrimSpace(v.GetString("pprof_listen"))
	c.HTTPListen = strings.TrimSpace(v.GetString("http_listen"))
	if c.HTTPListen == "" {
		return c, fmt.Errorf("%w: http_listen is empty, allowed: host:port", ErrInvalid)
	}
	ms := func(key string, max int) (time.Duration, error) {
		n, err := positive(v, key, max)
		return time.Duration(n) * time.Millisecond, err
	}
	if c.RouterStall, err = ms("router_stall_ms", 3600*1000); err != nil {
		return c, err
	}
	if c.RouterStallFactor, err = positive(v, "router_stall_factor", 1000); err != nil {
		return c, err
	}
	if c.RouterStallFloor, err = ms("router_stall_floor_ms", 3600*1000); err != nil {
		return c, err
	}
	if c.RouterStallCeiling, err = ms("router_stall_ceiling_ms", 3600*1000); err != nil {
		return c, err
	}
	if c.RouterStallFloor > c.RouterStall || c.RouterStall > c.RouterStallCeiling {
		return c, fmt.Errorf("%w: router_stall_floor_ms=%d, router_stall_ms=%d, router_stall_ceiling_ms=%d: want floor <= router_stall_ms <= ceiling",
			ErrInvalid, c.RouterStallFloor.Milliseconds(), c.RouterStall.Milliseconds(), c.RouterStallCeiling.Milliseconds())
	}
	if c.RouterFirstToken, err = ms("router_first_token_ms", 3600*1000); err != nil {
		return c, err
	}
	if c.RouterPrefillTimeout, err = ms("router_prefill_timeout_ms", 3600*1000); err != nil {
		return c, err
	}
	if c.RouterAssignSeed, err = oneOf(v, "router_assign_seed", "on", "off"); err != nil {
		return c, err
	}
	if c.RouterMaxResumes, err = positive(v, "router_max_resumes", 100); err != nil {
		return c, err
	}
	if c.RouterMaxBodyBytes, err = positive(v, "router_max_body_bytes", 1<<30); err != nil {
		return c, err
	}
	if c.RouterReadHeaderTimeout, err = ms("router_read_header_timeout_ms", 3600*1000); err != nil {
		return c, err
	}
	if c.RouterReadTimeout, err = ms("router_read_timeout_ms", 3600*1000); err != nil {
		return c, err
	}
	if c.RouterIdleTimeout, err = ms("router_idle_timeout_ms", 3600*1000); err != nil {
		return c, err
	}
	if c.RouterMaxConns, err = positive(v, "router_max_conns", 1<<20); err != nil {
		return c, err
	}
	if c.RouterMaxInFlight, err = positive(v, "router_max_in_flight", 1<<20); err != nil {
		return c, err
	}
	if c.RouterGOGC, err = positive(v, "router_gogc", 10000); err != nil {
		return c, err
	}
	if c.APIKeys, err = apiKeys(v, "api_key", "api_key_file"); err != nil {
		return c, err
	}
	if c.AdminKeys, err = apiKeys(v, "admin_api_key", "admin_api_key_file"); err != nil {
		return c, err
	}
	c.NATSURL = strings.TrimSpace(v.GetString("nats_url"))
	c.NATSListen = strings.TrimSpace(v.GetString("nats_listen"))
	c.DataDir = v.GetString("data_dir")
	switch a := strings.TrimSpace(v.GetString("nats_auth")); a {
	case "on", "true":
		c.NATSAuth = true
	case "off", "false":
		c.NATSAuth = false
	default:
		return c, fmt.Errorf("%w: nats_auth=%q, allowed: on or off", ErrInvalid, a)
	}
	if c.AuthDir = strings.TrimSpace(v.GetString("auth_dir")); c.AuthDir == "" && c.DataDir != "" {
		c.AuthDir = filepath.Join(c.DataDir, "auth")
	}
	c.NATSCreds = strings.TrimSpace(v.GetString("nats_creds"))
	c.NATSTLSCA = strings.TrimSpace(v.GetString("nats_tls_ca"))
	c.NATSTLSCert = strings.TrimSpace(v.GetString("nats_tls_cert"))
	c.NATSTLSKey = strings.TrimSpace(v.GetString("nats_tls_key"))
	if (c.NATSTLSCert == "") != (c.NATSTLSKey == "") {
		return c, fmt.Errorf("%w: nats_tls_cert and nats_tls_key go together (one is empty)", ErrInvalid)
	}
	switch c.DataTLS = strings.TrimSpace(v.GetString("data_tls")); c.DataTLS {
	case "auto", "off":
	case "on":
		if (c.NATSTLSCert == "" || c.NATSTLSCA == "") && !c.HasCreds() {
			return c, fmt.Errorf("%w: data_tls=on needs nats_tls_cert, nats_tls_key and nats_tls_ca (the member's certificate and the cluster's CA), or member credentials (nats_auth=on with the embedded server, or nats_creds)", ErrInvalid)
		}
	default:
		return c, fmt.Errorf("%w: data_tls=%q, allowed: auto, on or off", ErrInvalid, c.DataTLS)
	}
	if c.NATSURL == "" && c.NATSTLSCert != "" && c.NATSTLSCA == "" {
		return c, fmt.Errorf("%w: nats_tls_cert without nats_tls_ca: connexd connects to its own embedded server and must verify it (for a self-signed certificate, nats_tls_ca is the certificate itself)", ErrInvalid)
	}
	switch c.ClusterTLS = strings.TrimSpace(v.GetString("cluster_tls")); c.ClusterTLS {
	case "auto", "off":
	case "on":
		if !c.HasCreds() {
			return c, fmt.Errorf("%w: cluster_tls=on needs member credentials: nats_auth=on with the embedded server, or nats_creds", ErrInvalid)
		}
	default:
		return c, fmt.Errorf("%w: cluster_tls=%q, allowed: auto, on or off", ErrInvalid, c.ClusterTLS)
	}
	c.ShmDir = strings.TrimSpace(v.GetString("shm_dir"))
	c.RegionSocket = strings.TrimSpace(v.GetString("region_socket"))
	if len(c.RegionSocket) > 107 { // sockaddr_un's sun_path, less its NUL
		return c, fmt.Errorf("%w: region_socket=%q is %d bytes, allowed: at most 107 (a unix socket address)", ErrInvalid, c.RegionSocket, len(c.RegionSocket))
	}
	if c.RegionDir = strings.TrimSpace(v.GetString("region_dir")); c.RegionDir == "" {
		return c, fmt.Errorf("%w: region_dir is empty, allowed: the directory engines' region files live in (e.g. /dev/shm)", ErrInvalid)
	}
	for _, f := range strings.Split(v.GetString("region_owner_uids"), ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		uid, err := strconv.Atoi(f)
		if err != nil || uid < 0 {
			return c, fmt.Errorf("%w: region_owner_uids=%q, allowed: comma-separated non-negative uids", ErrInvalid, v.GetString("region_owner_uids"))
		}
		c.RegionOwners = append(c.RegionOwners, uid)
	}
	c.DataListen = v.GetString("data_listen")
	c.DataAdvertise = strings.TrimSpace(v.GetString("data_advertise"))
	if c.JSReplicas, err = positive(v, "js_replicas", 5); err != nil {
		return c, err
	}
	nonNegative := func(key string) (uint64, error) {
		raw := strings.TrimSpace(v.GetString(key))
		n, err := strconv.ParseUint(raw, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: %s=%q, allowed: a byte count (0: the default)", ErrInvalid, key, raw)
		}
		return n, nil
	}
	if c.RegionMaxBytes, err = nonNegative("region_max_bytes"); err != nil {
		return c, err
	}
	if c.RegionMaxBytesPerEngine, err = nonNegative("region_max_bytes_per_engine"); err != nil {
		return c, err
	}
	if c.RegionMaxPerEngine, err = positive(v, "region_max_per_engine", 1<<16); err != nil {
		return c, err
	}
	if c.HoldsMaxPerEngine, err = positive(v, "holds_max_per_engine", 1<<24); err != nil {
		return c, err
	}
	if c.RequestsMax, err = positive(v, "requests_max", 1<<24); err != nil {
		return c, err
	}
	if c.NATSMaxConnections, err = positive(v, "nats_max_connections", 1<<20); err != nil {
		return c, err
	}
	if c.NATSEngineConnections, err = positive(v, "nats_engine_connections", 1<<16); err != nil {
		return c, err
	}
	rsb, err := positive(v, "request_store_bytes", 1<<50)
	if err != nil {
		return c, err
	}
	c.RequestStoreBytes = int64(rsb)
	for _, h := range strings.Split(v.GetString("engine_url_hosts"), ",") {
		if h = strings.TrimSpace(h); h != "" {
			c.EngineURLHosts = append(c.EngineURLHosts, h)
		}
	}
	if c.RequestsMaxPerEngine, err = positive(v, "requests_max_per_engine", 1<<24); err != nil {
		return c, err
	}
	rbe, err := nonNegative("request_bytes_per_engine")
	if err != nil {
		return c, err
	}
	if rbe > 1<<50 {
		return c, fmt.Errorf("%w: request_bytes_per_engine=%d, allowed: a byte count up to 2^50 (0: the default)", ErrInvalid, rbe)
	}
	if c.RequestBytesPerEngine = int64(rbe); rbe == 0 {
		c.RequestBytesPerEngine = c.RequestStoreBytes / 8
	}
	ttl, err := positive(v, "request_ttl_s", 30*24*3600)
	if err != nil {
		return c, err
	}
	c.RequestTTL = time.Duration(ttl) * time.Second
	c.MemberID = v.GetString("member_id")
	if c.MemberID == "" {
		c.MemberID = defaultMemberID()
	}
	if !memberIDRe.MatchString(c.MemberID) {
		return c, fmt.Errorf("%w: member_id=%q, allowed: 1-64 letters, digits, '-' or '_'", ErrInvalid, c.MemberID)
	}
	if c.MemberID == "engine" { // natssubject.ReservedMemberID: engines' notice subjects are connex.v1.engine.…
		return c, fmt.Errorf("%w: member_id=%q is reserved (engines' notice subjects start connex.v1.engine); pick another", ErrInvalid, c.MemberID)
	}
	if c.NATSURL == "" && c.DataDir == "" {
		return c, fmt.Errorf("%w: data_dir is empty, allowed: a directory for the embedded NATS server", ErrInvalid)
	}
	return c, nil
}

func defaultMemberID() string {
	host, _ := os.Hostname()
	host = regexp.MustCompile(`[^A-Za-z0-9_-]`).ReplaceAllString(host, "-")
	if len(host) > 40 {
		host = host[:40]
	}
	var b [4]byte
	_, _ = rand.Read(b[:])
	if host == "" {
		host = "connexd"
	}
	return host + "-" + hex.EncodeToString(b[:])
}

// apiKeys are the keys of listKey (comma-separated) and of the file named by
// fileKey (one per line; blank lines and lines starting with # skipped).
func apiKeys(v *viper.Viper, listKey, fileKey string) ([]string, error) {
	var keys []string
	for _, k := range strings.Split(v.GetString(listKey), ",") {
		if k = strings.TrimSpace(k); k != "" {
			keys = append(keys, k)
		}
	}
	path := strings.TrimSpace(v.GetString(fileKey))
	if path == "" {
		return keys, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %s=%q: %w", ErrInvalid, fileKey, path, err)
	}
	n := len(keys)
	for _, line := range strings.Split(string(data), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			keys = append(keys, line)
		}
	}
	if len(keys) == n {
		return nil, fmt.Errorf("%w: %s=%q holds no key (one per line)", ErrInvalid, fileKey, path)
	}
	return keys, nil
}

// HasCreds reports whether this member connects to NATS with credentials:
// minted by its embedded server's authority (nats_auth on) or read from
// nats_creds.
func (c Config) HasCreds() bool {
	return (c.NATSURL == "" && c.NATSAuth) || c.NATSCreds != ""
}

// RemoteTLS reports whether protoactor's remote speaks mutual TLS
// (cluster_tls on, or auto with credentials).
func (c Config) RemoteTLS() bool {
	return c.ClusterTLS == "on" || (c.ClusterTLS == "auto" && c.HasCreds())
}
