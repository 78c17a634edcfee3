// Package netlab puts test "hosts" on a real network stack: each host is a
// Linux network namespace with its own address, joined to the others by a
// veth pair into a bridge in the root namespace (which also gets an
// address, so that the test process itself reaches every host). Processes
// started on a host (Host.Command) see only its interface; traffic between
// hosts crosses veth, the bridge and the kernel's TCP stack, as between
// machines on one switch. Faults are real too (faults.go): a link down,
// random packet loss and one-way drops with nftables.
//
// It needs root, iproute2 (ip) and, for faults, nftables (nft): Available
// says what is missing, so tests can skip with that message. It shells out
// to ip and nft, the tools an operator would use to reproduce a test by
// hand, rather than speaking netlink itself.
package netlab

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// ErrUnavailable is wrapped by Available's answer when this machine cannot
// run a lab.
var ErrUnavailable = errors.New("netlab: unavailable")

// Available returns nil when labs can be built here, else an error
// wrapping ErrUnavailable that says why (for t.Skip).
func Available() error {
	if os.Geteuid() != 0 {
		return fmt.Errorf("%w: network namespaces need root", ErrUnavailable)
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Errorf("%w: %s not installed (apt-get install iproute2 nftables)", ErrUnavailable, tool)
		}
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		return fmt.Errorf("%w: no network namespaces: %v", ErrUnavailable, err)
	}
	return nil
}

// Lab is a set of hosts on one bridge. Close removes everything it made.
type Lab struct {
	prefix  string // of every name it creates: "cx<pid>"
	bridge  string
	subnet  string // "10.77.N"
	gateway string // the bridge's (the test process's) address
	Hosts   []*Host

	mu     sync.Mutex
	closed bool
}

// Host is one network namespace of a Lab.
type Host struct {
	lab *Lab
	// Name is the host's name in the lab: "h1", "h2", ...
	Name string
	// NS is the network namespace's name (ip netns).
	NS string
	// IP is the host's address on the lab's bridge.
	IP string
	// veth is the host's interface (inside NS); peer its other end on the
	// bridge.
	veth, peer string
}

// New builds a lab of n hosts, h1..hn, at 10.77.N.1..n (N from this
// process id), and first removes labs left by processes that died.
func New(n int) (*Lab, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	if n < 1 || n > 200 {
		return nil, fmt.Errorf("netlab: %d hosts: want 1..200", n)
	}
	removeStale()
	pid := os.Getpid()
	l := &Lab{prefix: "cx" + strconv.Itoa(pid), subnet: fmt.Sprintf("10.77.%d", pid%250+1)}
	l.bridge, l.gateway = l.prefix+"br", l.subnet+".254"
	ok := false
	defer func() {
		if !ok {
			_ = l.Close()
		}
	}()
	if err := ipCmd("link", "add", l.bridge, "type", "bridge"); err != nil {
		return nil, err
	}
	if err := ipCmd("addr", "add", l.gateway+"/24", "dev", l.bridge); err != nil {
		return nil, err
	}
	if err := ipCmd("link", "set", l.bridge, "up"); err != nil {
		return nil, err
	}
	for i := 1; i <= n; i++ {
		h := &Host{lab: l, Name: "h" + strconv.Itoa(i), NS: l.prefix + "-h" + strconv.Itoa(i), IP: l.subnet + "." + strconv.Itoa(i),
			veth: "eth0", peer: l.prefix + "h" + strconv.Itoa(i)}
		l.Hosts = append(l.Hosts, h) // before it exists, so that Close removes what was made of it
		if err := l.addHost(h); err != nil {
			return nil, fmt.Errorf("netlab: host %s: %w", h.Name, err)
		}
	}
	ok = true
	return l, nil
}

func (l *Lab) addHost(h *Host) error {
	steps := [][]string{
		{"netns", "add", h.NS},
		{"link", "add", h.peer, "type", "veth", "peer", "name", h.veth, "netns", h.NS},
		{"link", "set", h.peer, "master", l.bridge, "up"},
		{"-n", h.NS, "addr", "add", h.IP + "/24", "dev", h.veth},
		{"-n", h.NS, "link", "set", h.veth, "up"},
		{"-n", h.NS, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if err := ipCmd(s...); err != nil {
			return err
		}
	}
	return nil
}

// Gateway is the test process's own address on the lab's bridge: what a
// host dials to reach something the test runs in the root namespace.
func (l *Lab) Gateway() string { return l.gateway }

// Close removes the lab's namespaces, interfaces and rules (processes still
// running in a namespace keep it until they exit). Idempotent.
func (l *Lab) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	var errs []error
	for _, h := range l.Hosts {
		// The veth pair goes with its root-side end at once; left to the
		// namespace's teardown it lingers while a process still holds the
		// namespace, or for seconds on a busy kernel.
		if err := ipCmd("link", "del", h.peer); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
			errs = append(errs, err)
		}
		if err := ipCmd("netns", "del", h.NS); err != nil && !strings.Contains(err.Error(), "No such file") {
			errs = append(errs, err)
		}
	}
	if err := ipCmd("link", "del", l.bridge); err != nil && !strings.Contains(err.Error(), "Cannot find device") {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Command is exec.Command of name run on the host (ip netns exec: the
// process is name itself, in the host's namespace).
func (h *Host) Command(name string, args ...string) *exec.Cmd {
	return exec.Command("ip", append([]string{"netns", "exec", h.NS, name}, args...)...)
}

// MachineCommand is Command with the process also in a PID namespace of
// its own (it is pid 1 there), so that it and the processes of other hosts
// cannot name each other by pid: same-machine shortcuts that rely on it
// (UCX's CMA reads with process_vm_readv) do not apply, as between two
// machines. The process must handle the signals it is sent (a pid 1 gets
// no default actions); SIGKILL always works.
func (h *Host) MachineCommand(name string, args ...string) *exec.Cmd {
	cmd := h.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	return cmd
}

// RxBytes is the number of bytes the host's interface has received, so
// that a test can tell its traffic crossed the lab's network.
func (h *Host) RxBytes() (uint64, error) {
	out, err := h.Command("cat", "/sys/class/net/"+h.veth+"/statistics/rx_bytes").Output()
	if err != nil {
		return 0, fmt.Errorf("netlab: rx_bytes of %s: %w", h.Name, err)
	}
	n, err := strconv.ParseUint(strings.TrimSpace(string(out)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("netlab: rx_bytes of %s: %w", h.Name, err)
	}
	return n, nil
}

// Addr is host:port on this host.
func (h *Host) Addr(port int) string { return h.IP + ":" + strconv.Itoa(port) }

// removeStale deletes namespaces and bridges of labs whose process died.
func removeStale() {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) == 0 {
				continue
			}
			if pid, ok := labPID(f[0]); ok && !alive(pid) {
				_ = ipCmd("netns", "del", f[0])
			}
		}
	}
	out, err = exec.Command("ip", "-o", "link", "show", "type", "bridge").Output()
	if err == nil {
		for _, line := range strings.Split(string(out), "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			name := strings.TrimSuffix(f[1], ":")
			if pid, ok := labPID(strings.TrimSuffix(name, "br")); ok && strings.HasSuffix(name, "br") && !alive(pid) {
				_ = ipCmd("link", "del", name)
			}
		}
	}
}

// labPID parses the pid out of a lab name "cx<pid>[-...]".
func labPID(name string) (int, bool) {
	rest, ok := strings.CutPrefix(name, "cx")
	if !ok {
		return 0, false
	}
	if i := strings.IndexByte(rest, '-'); i >= 0 {
		rest = rest[:i]
	}
	pid, err := strconv.Atoi(rest)
	return pid, err == nil && pid > 0
}

func alive(pid int) bool {
	_, err := os.Stat("/proc/" + strconv.Itoa(pid))
	return err == nil
}

func ipCmd(args ...string) error { return run("ip", args...) }

func run(name string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("netlab: %s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}
