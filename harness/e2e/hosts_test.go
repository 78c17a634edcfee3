package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/harness/netlab"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// hostLab is the production topology on one machine: netlab hosts (network
// namespaces on a bridge), one nats-server per host joined in a cluster
// with JetStream, and connexd members started on the hosts, each with its
// data plane and cluster remote on its host's address.
type hostLab struct {
	t    testing.TB
	lab  *netlab.Lab
	nats []*clusterNATS // nats[i] runs on lab.Hosts[i]
}

// newHostLab builds n hosts and starts the NATS cluster on them; it skips
// the test where network namespaces cannot be made.
func newHostLab(t testing.TB, n int) *hostLab {
	t.Helper()
	if err := netlab.Available(); err != nil {
		missing(t, err.Error())
	}
	lab, err := netlab.New(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := lab.Close(); err != nil {
			t.Errorf("close lab: %v", err)
		}
	})
	l := &hostLab{t: t, lab: lab}
	bin := natsServerBin(t)
	dir := t.TempDir()
	for i, h := range lab.Hosts {
		var routes []string
		for _, o := range lab.Hosts {
			if o != h {
				routes = append(routes, "nats://"+o.Addr(6222))
			}
		}
		ns := &clusterNATS{t: t, bin: bin, host: h, name: fmt.Sprintf("n%d", i+1), url: "nats://" + h.Addr(4222)}
		ns.conf = filepath.Join(dir, ns.name+".conf")
		// The operator's configuration of one node of a LAN cluster (README,
		// "Production topology"): a name, client and cluster listeners on the
		// host's address, routes to the other nodes, JetStream on local disk.
		// ping_interval is lowered from 2 minutes so that a route or client
		// cut without a reset is noticed in seconds.
		text := fmt.Sprintf(`server_name: %s
listen: %s
http: %s
ping_interval: "2s"
ping_max: 3
jetstream { store_dir: %q }
cluster {
  name: connex
  listen: %s
  routes: [%s]
}
`, ns.name, h.Addr(4222), h.Addr(8222), filepath.Join(dir, ns.name+"-js"), h.Addr(6222), strings.Join(routes, ", "))
		if err := os.WriteFile(ns.conf, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		l.nats = append(l.nats, ns)
	}
	for _, ns := range l.nats {
		ns.start()
	}
	t.Cleanup(func() {
		for _, ns := range l.nats {
			ns.kill()
		}
	})
	for _, ns := range l.nats {
		ns.waitJetStream(30 * time.Second)
	}
	l.waitPlacement(len(l.nats))
	return l
}

// waitPlacement polls until the cluster places a stream on r servers (its
// JetStream peers have all joined): a probe stream, created and deleted.
func (l *hostLab) waitPlacement(r int) {
	l.t.Helper()
	nc, err := nats.Connect(l.urls(l.lab.Hosts[0]))
	if err != nil {
		l.t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		l.t.Fatal(err)
	}
	checkFor(l.t, 30*time.Second, 200*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "netlab_probe", Replicas: r, Storage: jetstream.MemoryStorage}); err != nil {
			return fmt.Errorf("R%d probe stream: %w", r, err)
		}
		return js.DeleteStream(ctx, "netlab_probe")
	})
}

// urls lists every server's client URL, the one on host h first.
func (l *hostLab) urls(h *netlab.Host) string {
	var out []string
	for _, ns := range l.nats {
		if ns.host == h {
			out = append([]string{ns.url}, out...)
		} else {
			out = append(out, ns.url)
		}
	}
	return strings.Join(out, ",")
}

// connexd starts a member on host h against the NATS cluster (all three
// URLs, its host's first), with the TCP data plane, its cluster remote and
// metrics on h's address, the request bucket at three replicas and the LAN
// failure-detection preset, plus args.
func (l *hostLab) connexd(h *netlab.Host, member string, args ...string) *proc {
	l.t.Helper()
	return l.connexdWith(h, member, nil, args...)
}

// connexdWith is connexd with environment variables added to the member's.
func (l *hostLab) connexdWith(h *netlab.Host, member string, env []string, args ...string) *proc {
	l.t.Helper()
	return l.startMember(h, false, member, env, args...)
}

// connexdMachine is connexdWith with the member in a PID namespace of its
// own (netlab's MachineCommand): no same-machine shortcut reaches it.
func (l *hostLab) connexdMachine(h *netlab.Host, member string, env []string, args ...string) *proc {
	l.t.Helper()
	return l.startMember(h, true, member, env, args...)
}

func (l *hostLab) startMember(h *netlab.Host, machine bool, member string, env []string, args ...string) *proc {
	l.t.Helper()
	all := append([]string{"--member-id", member, "--data-dir", l.t.TempDir(), "--log-level", "info",
		"--nats-url", l.urls(h), "--backend", "tcp", "--data-listen", h.Addr(0), "--cluster-host", h.IP,
		"--metrics-listen", h.Addr(0), "--js-replicas", "3", "--cluster-preset", "lan", "--orphan-scan-ms", "200"}, args...)
	command := h.Command
	if machine {
		command = h.MachineCommand
	}
	cmd := command(connexdBin, all...)
	return startCmd(l.t, "connexd", member, cmd, all, env...)
}

// conn connects the test, playing an engine on host h, to h's server (and,
// should it go, to the others in order).
func (l *hostLab) conn(h *netlab.Host) *nats.Conn {
	l.t.Helper()
	nc, err := nats.Connect(l.urls(h), nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		l.t.Fatal(err)
	}
	l.t.Cleanup(nc.Close)
	return nc
}

// server returns the node named name ("n1"...).
func (l *hostLab) server(name string) *clusterNATS {
	for _, ns := range l.nats {
		if ns.name == name {
			return ns
		}
	}
	l.t.Fatalf("no NATS server %s", name)
	return nil
}

// bucketInfo is the request bucket's stream as JetStream reports it, asked
// through nc.
func bucketInfo(ctx context.Context, nc *nats.Conn) (*jetstream.StreamInfo, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	s, err := js.Stream(ctx, "KV_"+requests.Bucket)
	if err != nil {
		return nil, err
	}
	return s.Info(ctx)
}

// clusterNATS is one nats-server OS process of the lab's cluster, on its
// host, restartable with the same configuration and store.
type clusterNATS struct {
	t          testing.TB
	bin, conf  string
	host       *netlab.Host
	name, url  string
	mu         sync.Mutex
	cmd        *exec.Cmd
	exited     chan struct{}
	logs       strings.Builder
	logsBefore string // of earlier runs
}

func (n *clusterNATS) start() {
	n.t.Helper()
	cmd := n.host.Command(n.bin, "-c", n.conf)
	w := &lockedWriter{mu: &n.mu, b: &n.logs}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		n.t.Fatalf("start nats-server %s: %v", n.name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	n.mu.Lock()
	n.cmd, n.exited = cmd, exited
	n.mu.Unlock()
	n.t.Cleanup(func() {
		if n.t.Failed() {
			n.mu.Lock()
			logs := n.logsBefore + n.logs.String()
			n.mu.Unlock()
			if len(logs) > 4000 {
				logs = "…" + logs[len(logs)-4000:]
			}
			n.t.Logf("nats-server %s log:\n%s", n.name, logs)
		}
	})
}

// waitJetStream polls until the server accepts clients and its JetStream
// answers (the cluster has a meta leader).
func (n *clusterNATS) waitJetStream(total time.Duration) {
	n.t.Helper()
	checkFor(n.t, total, 100*time.Millisecond, func() error {
		nc, err := nats.Connect(n.url, nats.Timeout(time.Second))
		if err != nil {
			return err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err
	})
}

// kill SIGKILLs the server (no clean shutdown, as in a host crash) and
// waits until it is gone.
func (n *clusterNATS) kill() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
	n.mu.Lock()
	n.logsBefore += n.logs.String() + "--- killed ---\n"
	n.logs.Reset()
	n.mu.Unlock()
}

// clients names the server's client connections (its /connz monitoring
// endpoint).
func (n *clusterNATS) clients() ([]string, error) {
	resp, err := http.Get("http://" + n.host.Addr(8222) + "/connz")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var connz struct {
		Connections []struct {
			Name string `json:"name"`
		} `json:"connections"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&connz); err != nil {
		return nil, fmt.Errorf("%s /connz: %w", n.name, err)
	}
	var names []string
	for _, c := range connz.Connections {
		names = append(names, c.Name)
	}
	return names, nil
}

// lockedWriter serializes writes into a builder shared with readers.
type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// hostPD is a prefill member on the first host and decode members on the
// others, each with an engine the test plays through a connection to its
// host's NATS server.
type hostPD struct {
	*hostLab
	prefill *proc
	engP    *engine
	procs   map[string]*proc
	engines map[string]*engine
	ncs     map[string]*nats.Conn // per member: the test's connection on its host
}

// newHostPD starts the lab and members: "p1" (prefill) on h1 and "dN"
// (decode) on each hN, N >= 2.
func newHostPD(t testing.TB, hosts int, prefillArgs ...string) *hostPD {
	return newHostLab(t, hosts).startPD(prefillArgs...)
}

// startPD starts newHostPD's members on the lab.
func (l *hostLab) startPD(prefillArgs ...string) *hostPD {
	t := l.t
	c := &hostPD{hostLab: l, procs: map[string]*proc{}, engines: map[string]*engine{}, ncs: map[string]*nats.Conn{}}
	h1 := l.lab.Hosts[0]
	c.prefill = l.connexd(h1, "p1", append([]string{"--role", "prefill"}, prefillArgs...)...)
	c.procs["p1"] = c.prefill
	c.ncs["p1"] = l.conn(h1)
	c.engP = newEngine(t, c.ncs["p1"], "p1", "engP", testLayout, true)
	for _, h := range l.lab.Hosts[1:] {
		name := "d" + strings.TrimPrefix(h.Name, "h")
		c.procs[name] = l.connexd(h, name, "--role", "decode")
		c.ncs[name] = l.conn(h)
		c.engines[name] = newEngine(t, c.ncs[name], name, "eng-"+name, testLayout, false)
	}
	c.waitMembers(len(l.lab.Hosts))
	return c
}

// waitMembers polls until every member's view holds n members (their
// status over NATS).
func (c *hostPD) waitMembers(n int) {
	c.t.Helper()
	checkFor(c.t, 30*time.Second, 50*time.Millisecond, func() error {
		for name, e := range c.engines {
			st, err := e.cli.MemberStatus(ctx5(c.t), &messages.MemberStatusRequest{})
			if err != nil {
				return fmt.Errorf("%s: %v", name, err)
			}
			if len(st.ClusterMembers) < n {
				return fmt.Errorf("%s sees %v, want %d members", name, st.ClusterMembers, n)
			}
		}
		return nil
	})
}

func (c *hostPD) hold(t testing.TB, blocks []uint32, tokens uint32) *messages.KVTransferParams {
	t.Helper()
	h, err := c.engP.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: c.engP.id, RegionId: c.engP.rid, BlockIds: blocks, NumTokens: tokens})
	if err != nil {
		t.Fatal(err)
	}
	return h.Params
}
