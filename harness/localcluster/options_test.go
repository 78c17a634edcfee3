package localcluster

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func TestWithDefaults(t *testing.T) {
	if _, err := (Options{Sim: "s"}).withDefaults(); err == nil {
		t.Error("no Connexd: want an error")
	}
	if _, err := (Options{Connexd: "c"}).withDefaults(); err == nil {
		t.Error("no Sim: want an error")
	}
	if _, err := (Options{Connexd: "c", Sim: "s", Decode: -1}).withDefaults(); err == nil {
		t.Error("negative count: want an error")
	}
	o, err := (Options{Connexd: "c", Sim: "s"}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if o.Prefill != 1 || o.Decode != 2 || o.Model != "connex-sim" || o.Layout != "small" ||
		o.RouterHTTP != "127.0.0.1:0" || o.NATSListen != "127.0.0.1:0" || o.ClusterPreset != "local" ||
		o.LogLevel != "warn" || o.StartTimeout != 30*time.Second || o.StopTimeout != 10*time.Second {
		t.Errorf("defaults: %+v", o)
	}
	d := Defaults()
	if d.PrefillPerToken != 50*time.Microsecond || d.DecodePerToken != 20*time.Millisecond || d.Decode != 2 {
		t.Errorf("Defaults() = %+v", d)
	}
}

// flagValue is the value after flag in args, and whether it occurs once.
func flagValue(args []string, flag string) (string, bool) {
	i := slices.Index(args, flag)
	if i < 0 || i+1 >= len(args) || slices.Index(args[i+1:], flag) >= 0 {
		return "", false
	}
	return args[i+1], true
}

func wantFlags(t *testing.T, what string, args []string, want map[string]string) {
	t.Helper()
	for flag, v := range want {
		if got, ok := flagValue(args, flag); !ok || got != v {
			t.Errorf("%s: %s = %q (once: %v), want %q; args %q", what, flag, got, ok, v, args)
		}
	}
}

func TestRouterArgs(t *testing.T) {
	o, _ := (Options{Connexd: "c", Sim: "s", ConnexdArgs: []string{"--retain-s", "5"},
		RouterArgs: []string{"--log-level", "debug"}}).withDefaults()
	args := o.routerArgs("/d/router", "127.0.0.1:0", "127.0.0.1:8000")
	wantFlags(t, "router", args, map[string]string{
		"--role": "router", "--member-id": "router", "--http-listen": "127.0.0.1:8000",
		"--data-dir": "/d/router", "--cluster-preset": "local", "--nats-listen": "127.0.0.1:0", "--retain-s": "5",
	})
	if slices.Contains(args, "--nats-url") {
		t.Errorf("embedded NATS: no --nats-url wanted: %q", args)
	}
	// Extra flags come last, so they win over the defaults (pflag keeps the last).
	if !strings.HasSuffix(strings.Join(args, " "), "--retain-s 5 --log-level debug") {
		t.Errorf("extra flags not last: %q", args)
	}

	o.NATSURL = "nats://10.0.0.1:4222"
	args = o.routerArgs("/d/router", "127.0.0.1:0", "127.0.0.1:8000")
	wantFlags(t, "router, external NATS", args, map[string]string{"--nats-url": "nats://10.0.0.1:4222"})
	if slices.Contains(args, "--nats-listen") {
		t.Errorf("external NATS: no --nats-listen wanted: %q", args)
	}
}

func TestEngineConnexdArgs(t *testing.T) {
	o, _ := (Options{Connexd: "c", Sim: "s", ConnexdArgs: []string{"--backend", "tcp"},
		PrefillConnexdArgs: []string{"--retain-s", "5"},
		DecodeConnexdArgs:  []string{"--kv-load-failure-policy", "recompute"}}).withDefaults()
	p := o.engineConnexdArgs("prefill-0", RolePrefill, "nats://127.0.0.1:4222", "/d/prefill-0")
	wantFlags(t, "prefill connexd", p, map[string]string{
		"--role": "prefill", "--member-id": "prefill-0", "--nats-url": "nats://127.0.0.1:4222",
		"--data-dir": "/d/prefill-0", "--cluster-preset": "local", "--backend": "tcp", "--retain-s": "5",
	})
	if slices.Contains(p, "--kv-load-failure-policy") {
		t.Errorf("prefill got decode's flags: %q", p)
	}
	d := o.engineConnexdArgs("decode-1", RoleDecode, "nats://x", "/d/decode-1")
	wantFlags(t, "decode connexd", d, map[string]string{
		"--role": "decode", "--member-id": "decode-1", "--kv-load-failure-policy": "recompute",
	})
	if slices.Contains(d, "--retain-s") || slices.Contains(d, "--http-listen") {
		t.Errorf("decode got others' flags: %q", d)
	}
}

func TestSimArgs(t *testing.T) {
	o, _ := (Options{Connexd: "c", Sim: "s", Model: "m", Layout: "llama3-8b", Blocks: 640,
		PrefillPerToken: 50 * time.Microsecond, DecodePerToken: 20 * time.Millisecond, MaxModelLen: 9000,
		SimArgs: []string{"--advertise-url", "http://h:1"}}).withDefaults()
	args := o.simArgs("decode-1", RoleDecode, "nats://127.0.0.1:4222")
	wantFlags(t, "sim", args, map[string]string{
		"--role": "decode", "--nats": "nats://127.0.0.1:4222", "--member": "decode-1", "--engine-id": "decode-1",
		"--listen": "127.0.0.1:0", "--model": "m", "--layout": "llama3-8b", "--blocks": "640",
		"--prefill-us-per-token": "50", "--decode-ms-per-token": "20", "--max-model-len": "9000",
		"--log-level": "warn", "--advertise-url": "http://h:1",
	})
	// Zero costs are passed (free), zero Blocks and MaxModelLen are left to the sim.
	o, _ = (Options{Connexd: "c", Sim: "s"}).withDefaults()
	args = o.simArgs("prefill-0", RolePrefill, "nats://x")
	wantFlags(t, "sim zero", args, map[string]string{"--prefill-us-per-token": "0", "--decode-ms-per-token": "0"})
	if slices.Contains(args, "--blocks") || slices.Contains(args, "--max-model-len") {
		t.Errorf("zero Blocks/MaxModelLen passed: %q", args)
	}
}
