package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/connex/connex/harness/localcluster"
)

// banner is what a user reads once the cluster is ready. nats is the nats
// CLI to name ("" when none was found).
func banner(c *localcluster.Cluster, o localcluster.Options, files clusterFiles, nats string) string {
	pids := c.PIDs()
	var b strings.Builder
	fmt.Fprintf(&b, "\nconnex-up: ready — router %s (pid %d), NATS %s\n", c.RouterURL(), pids[localcluster.RouterName], c.NATSURL())
	var decode []localcluster.Engine
	for _, e := range c.Engines() {
		fmt.Fprintf(&b, "  %-10s engine %s (pid %d), connexd pid %d\n", e.Name, e.URL, e.EnginePID, e.ConnexdPID)
		if o.VLLM != nil && o.VLLM.LogDir != "" {
			fmt.Fprintf(&b, "  %-10s vLLM's log: %s\n", "", localcluster.EngineLogPath(o.VLLM.LogDir, e.Name))
		}
		if e.Role == localcluster.RoleDecode {
			decode = append(decode, e)
		}
	}
	engine, pace, tokens := "connex-sim", fmt.Sprintf("300 tokens at %s each", o.DecodePerToken), 300
	if o.VLLM != nil {
		engine, pace, tokens = "vllm serve", "greedy, from a real vLLM", 3000
	}
	auth := ""
	if o.APIKey != "" {
		auth = ` -H "Authorization: Bearer $(head -1 <your --api-key-file>)"`
	}
	fmt.Fprintf(&b, `
A streamed completion (%s):
  curl -N -i %s/v1/completions%s -H 'Content-Type: application/json' \
    -d '{"model":"%s","prompt":"Once upon a time","max_tokens":%d,"stream":true}'

Watch a resume: while it streams, kill the decode engine serving it (the X-Connex-Decode-Engine
header names it); the stream carries on from another decode engine, with no second prefill:
`, pace, c.RouterURL(), auth, o.Model, tokens)
	for _, e := range decode {
		fmt.Fprintf(&b, "  %-20s # %s's %s\n", killCommand(o, e.Name+"/engine", e.EnginePID), e.Name, engine)
	}
	if o.Restart.Enabled() {
		fmt.Fprintf(&b, "A killed engine, connexd or router is started again after %s, as systemd or Kubernetes would\n"+
			"(connex-up prints its new pid): do it again as often as you like. --restart-after 0 turns that off.\n", o.Restart.After)
	}

	fmt.Fprintf(&b, "\nPoint a shell at this cluster (NATS URL and credentials, router URL, admin key file):\n  . %s\n", files.sourced())
	fmt.Fprintf(&b, "  %-40s # every member, engine, hold and request\n", o.Connexd+" status")
	if nats != "" {
		fmt.Fprintf(&b, "  %-40s # the connex NATS micro service\n", nats+" micro ls")
	} else {
		fmt.Fprintf(&b, "  (no nats CLI here: `make bin/nats` builds natscli %s into ./bin, or\n"+
			"   GOBIN=$PWD/bin go install github.com/nats-io/natscli/nats@%s)\n", natscliVersion, natscliVersion)
	}
	fmt.Fprintf(&b, "  %s\n", `curl -H "Authorization: Bearer $(cat "$CONNEX_ADMIN_KEY_FILE")" "$CONNEX_ROUTER_URL/connex/v1/engines"`)
	creds := ""
	if f := c.AdminCreds(); f != "" {
		creds = " --creds " + f
	}
	fmt.Fprintf(&b, "(or, in any shell: %s status --nats-url %s%s)\n", o.Connexd, c.NATSURL(), creds)

	fmt.Fprintf(&b, "\nMetrics (Prometheus text); Prometheus scrapes them all with\n  prometheus --config.file=%s\n", files.prometheus)
	for _, m := range c.MetricsTargets() {
		note := ""
		if m.Admin {
			note = `   # -H "Authorization: Bearer $(cat ` + c.AdminKeyFile() + `)"`
		}
		fmt.Fprintf(&b, "  %-18s %s%s\n", m.Process, m.URL, note)
	}
	return b.String() + "\nCtrl-C stops every process.\n"
}

// killCommand is the command that kills process target (pid) as a crash
// would: a `vllm serve` engine is a process group (API server and engine
// core).
func killCommand(o localcluster.Options, target string, pid int) string {
	if o.VLLM != nil && strings.HasSuffix(target, "/engine") {
		return fmt.Sprintf("kill -9 -- -%d", pid)
	}
	return fmt.Sprintf("kill -9 %d", pid)
}

// restartLine is the line printed for one step of an automatic restart.
func restartLine(ev localcluster.RestartEvent, o localcluster.Options) string {
	switch ev.Phase {
	case localcluster.RestartScheduled:
		return fmt.Sprintf("connex-up: %s (pid %d) exited (%s); starting it again in %s", ev.Target, ev.OldPID, ev.Exit, ev.Delay)
	case localcluster.Restarted:
		s := fmt.Sprintf("connex-up: %s is back: pid %d (was %d, %s)", ev.Target, ev.NewPID, ev.OldPID, ev.Exit)
		if ev.URL != "" {
			s += ", " + ev.URL
		}
		if ev.Metrics != "" {
			s += ", metrics " + ev.Metrics
		}
		return s + "; again: " + killCommand(o, ev.Target, ev.NewPID)
	default:
		return fmt.Sprintf("connex-up: %s did not come back: %v", ev.Target, ev.Err)
	}
}

// natsCLI is the nats CLI to name: path if it exists, else `nats` on
// PATH, else "".
func natsCLI(path string) string {
	if path != "" {
		if _, err := os.Stat(path); err == nil {
			return path
		}
	}
	if _, err := exec.LookPath("nats"); err == nil {
		return "nats"
	}
	return ""
}
