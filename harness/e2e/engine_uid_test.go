package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/engine/shim"
	"github.com/connex/connex/harness/localcluster"
	"github.com/connex/connex/kvmem/handover"
	"github.com/connex/connex/messages"
)

// engineBase is the uid and gid the engines' own users count from here:
// each engine runs as engineBase plus its start index (issue 44: engines
// sharing a uid read each other's engine.creds). Any uid other than
// connexd's shows the same.
var engineBase = localcluster.User{UID: 61000, GID: 61000}

// TestEngineUnderItsOwnUID is issue 29's finding 6: engines had to run
// as connexd's user, because the region connexd creates was handed over as
// /proc/<connexd pid>/fd/<n>, which another uid cannot open; and as
// connexd's user they could read member.creds and act as a member. Here
// every connex-sim runs as a uid of its own while each connexd runs as root: the
// engines still get their regions (connexd hands the descriptor over its
// region socket), a request goes through with its KV pulled from the
// prefill engine's region into the decode engine's, and no engine user can read
// any connexd's member.creds.
func TestEngineUnderItsOwnUID(t *testing.T) {
	if os.Geteuid() != 0 {
		missing(t, "needs root: starts connex-sim as uids from 61000 (SysProcAttr.Credential) next to root connexds; CI runs as root")
	}
	bins := productBinaries(t)
	// productBinaries' directory is MkdirTemp's 0700: let the engines' users run connex-sim.
	if err := os.Chmod(filepath.Dir(bins.Sim), 0o755); err != nil {
		t.Fatal(err)
	}
	c := startProduct(t, func(o *localcluster.Options) {
		o.Decode = 1
		o.EngineUser = &engineBase
	})

	// Each engine runs as a uid of its own, its connexd as root.
	seen := map[uint32]string{}
	for name, pid := range c.PIDs() {
		uid, err := procUID(pid)
		if err != nil {
			t.Fatalf("%s (pid %d): %v", name, pid, err)
		}
		want := uint32(0)
		if engine, ok := strings.CutSuffix(name, "/engine"); ok {
			u := c.EngineUser(engine)
			if u == nil || u.UID == 0 {
				t.Fatalf("%s has no user of its own (EngineUser %v)", name, u)
			}
			want = u.UID
			if other, dup := seen[uid]; dup {
				t.Fatalf("%s and %s both run as uid %d", name, other, uid)
			}
			seen[uid] = name
		}
		if uid != want {
			t.Fatalf("%s runs as uid %d, want %d", name, uid, want)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	status, ans, err := postJSON(ctx, c.RouterURL()+"/v1/completions", map[string]any{
		"model": "connex-sim", "prompt": "the engines run under their own uid", "max_tokens": 8})
	if err != nil || status != 200 {
		t.Fatalf("completion: %d %v %v", status, ans, err)
	}
	if loaded := engineMetric(t, c, "decode", "connex_sim_kv_loaded_tokens_total"); loaded == 0 {
		t.Fatalf("the decode engine loaded no KV (connex_sim_kv_loaded_tokens_total 0): the prefill was not pulled; answer %v", ans)
	}

	// An engine's user reads its own engine.creds (the check can pass) but
	// no member.creds and no other engine's engine.creds.
	for _, e := range c.Engines() {
		dir := filepath.Join(c.Dir(), e.Name)
		me := *c.EngineUser(e.Name)
		if out, err := readAs(me, filepath.Join(dir, "engine.creds")); err != nil {
			t.Fatalf("the engine's user cannot read its own engine.creds (the test's control): %v: %s", err, out)
		}
		for _, o := range c.Engines() {
			if o.Name == e.Name {
				continue
			}
			out, err := readAs(me, filepath.Join(c.Dir(), o.Name, "engine.creds"))
			if err == nil {
				t.Fatalf("%s's user (uid %d) read %s's engine.creds (%d bytes): it could speak as that engine", e.Name, me.UID, o.Name, len(out))
			}
		}
		out, err := readAs(me, filepath.Join(dir, "member.creds"))
		if err == nil {
			t.Fatalf("the engine's user read %s/member.creds (%d bytes): it could act as member %s", dir, len(out), e.Name)
		}
		if !strings.Contains(out, "Permission denied") {
			t.Fatalf("reading %s/member.creds as the engine's user: %v: %s; want Permission denied", dir, err, out)
		}
	}
}

// procUID is the real uid of process pid.
func procUID(pid int) (uint32, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for l := range strings.Lines(string(b)) {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "Uid:" {
			var uid uint32
			_, err := fmt.Sscan(f[1], &uid)
			return uid, err
		}
	}
	return 0, fmt.Errorf("no Uid line in /proc/%d/status", pid)
}

// readAs reads path with cat running as u, and returns cat's output.
func readAs(u localcluster.User, path string) (string, error) {
	cmd := exec.Command("cat", path)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: u.UID, Gid: u.GID}}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestConnexdRefusesMemberCredsOthersCanRead: connexd does not start on a
// member credentials file that other users (an engine under its own uid)
// could read, and says how to fix it.
func TestConnexdRefusesMemberCredsOthersCanRead(t *testing.T) {
	creds := filepath.Join(t.TempDir(), "member.creds")
	if err := os.WriteFile(creds, []byte("not read: the mode is checked first\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(creds, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, connexdBin, "--role", "decode", "--member-id", "decode-0",
		"--nats-url", "nats://127.0.0.1:1", "--nats-creds", creds, "--data-dir", t.TempDir()).CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("connexd with a 0644 nats_creds: %v (context %v); want it to exit with an error\n%s", err, ctx.Err(), out)
	}
	for _, want := range []string{"mode 0644", "act as the member", "chmod 600 " + creds} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("connexd's error does not say %q:\n%s", want, out)
		}
	}
}

// TestRegionSocketHandsARegionOnlyToItsEngine: against a real connexd with
// engine credentials, the region socket hands engine A's region only to the
// bearer of the token A's region.create returned, once; engine B's own
// token, a guess and garbage are refused with a reason, and none of them
// burns A's token or hurts connexd. region.inspect never shows a token.
func TestRegionSocketHandsARegionOnlyToItsEngine(t *testing.T) {
	n := startSecuredNATS(t)
	startConnexd(t, "p", "--role", "prefill", "--backend", "tcp", "--cluster-preset", "lan",
		"--nats-url", n.url, "--nats-creds", n.creds(t, "--role", "member", "--member", "p"))
	_, acli := n.engine(t, "p", "engA")
	_, bcli := n.engine(t, "p", "engB")
	create := func(cli *api.Client, id string) *messages.RegionInfo {
		t.Helper()
		l := testLayout
		info, err := cli.CreateRegion(ctx5(t), &messages.CreateRegionRequest{EngineId: id, RegionId: "r0",
			Layout: &messages.Layout{NumLayers: l.Layers, KvPlanes: l.Planes, NumBlocks: l.Blocks, BlockBytes: l.BlockBytes, BlockSize: l.BlockSize, TpSize: l.TPSize}})
		if err != nil {
			t.Fatalf("region.create of %s: %v", id, err)
		}
		if info.HandoverSocket == "" || len(info.HandoverToken) != 32 {
			t.Fatalf("region.create of %s names no region socket and token: %v", id, info)
		}
		return info
	}
	a, b := create(acli, "engA"), create(bcli, "engB")
	receive := func(engine, token string) error {
		f, err := handover.Receive(ctx5(t), a.HandoverSocket, engine, "r0", token)
		if err == nil {
			f.Close()
		}
		return err
	}
	refused := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, handover.ErrRefused) || !strings.Contains(err.Error(), "no valid token") {
			t.Fatalf("%s: %v; want refused (no valid token)", what, err)
		}
	}
	refused("engine B's token for engine A's region", receive("engA", b.HandoverToken))
	refused("a guessed token for engine A's region", receive("engA", strings.Repeat("f", 32)))
	c, err := net.Dial("unixpacket", a.HandoverSocket)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = c.Write([]byte("\x00\xffgarbage"))
	buf := make([]byte, 512)
	k, _ := c.Read(buf)
	c.Close()
	if !strings.HasPrefix(string(buf[:k]), "ERR ") {
		t.Fatalf("garbage on the region socket: answer %q; want ERR", buf[:k])
	}

	if err := receive("engA", a.HandoverToken); err != nil {
		t.Fatalf("engine A with its own token, after the refused tries: %v", err)
	}
	refused("engine A's token a second time", receive("engA", a.HandoverToken))

	// region.create again (same layout: the same region) gives a new token,
	// with which the shim maps it.
	ra, err := shim.MapCreated(ctx5(t), create(acli, "engA"), testLayout)
	if err != nil {
		t.Fatalf("engine A maps its region again with a new token: %v", err)
	}
	defer ra.Close()
	if err := receive("engB", b.HandoverToken); err != nil {
		t.Fatalf("engine B with its own token: %v", err)
	}
	info, err := acli.InspectRegion(ctx5(t), &messages.RegionRef{EngineId: "engA", RegionId: "r0"})
	if err != nil || info.HandoverToken != "" {
		t.Fatalf("region.inspect: %v %v; want no token in it", info, err)
	}
}
