package netlab

import (
	"fmt"
	"strconv"
	"strings"
)

// Faults are nftables rules in the host's own namespace (table inet
// netlab), applied to packets the host sends, so that a fault is one-way
// unless the other host gets one too. The kernel here has no netem, so
// delay is not among them.

// Drop is one fault rule: packets from the host that match it are dropped.
type Drop struct {
	// To limits the rule to packets for this host; nil: any destination.
	To *Host
	// Port limits it to TCP packets to or from this port (either side of
	// a connection); 0: any packet.
	Port int
	// Percent drops that share of matching packets at random (1..99);
	// 0 or 100: every one.
	Percent int
}

func (d Drop) rules() ([]string, error) {
	var match string
	if d.To != nil {
		match = "ip daddr " + d.To.IP + " "
	}
	switch {
	case d.Percent < 0 || d.Percent > 100:
		return nil, fmt.Errorf("netlab: drop %d%%: want 0..100", d.Percent)
	case d.Percent > 0 && d.Percent < 100:
		match += fmt.Sprintf("numgen random mod 100 < %d ", d.Percent)
	}
	switch {
	case d.Port < 0 || d.Port > 65535:
		return nil, fmt.Errorf("netlab: port %d: want 0..65535", d.Port)
	case d.Port == 0:
		return []string{match + "counter drop"}, nil
	}
	// The port on either side: the host's requests to it and its answers
	// from it.
	return []string{
		fmt.Sprintf("%stcp dport %d counter drop", match, d.Port),
		fmt.Sprintf("%stcp sport %d counter drop", match, d.Port),
	}, nil
}

// AddDrop adds rules dropping the packets the host sends that match d.
func (h *Host) AddDrop(d Drop) error {
	rules, err := d.rules()
	if err != nil {
		return err
	}
	script := "table inet netlab {\n chain out {\n  type filter hook output priority 0; policy accept;\n  " +
		strings.Join(rules, "\n  ") + "\n }\n}\n"
	return h.nft(script)
}

// Isolate drops everything the host sends to the other hosts and everything
// they send to it: a partition of the host from the rest of the lab (the
// test process, on the bridge, still reaches it).
func (h *Host) Isolate() error {
	for _, o := range h.lab.Hosts {
		if o == h {
			continue
		}
		if err := h.AddDrop(Drop{To: o}); err != nil {
			return err
		}
		if err := o.AddDrop(Drop{To: h}); err != nil {
			return err
		}
	}
	return nil
}

// Heal removes every fault rule of the host and of the hosts that dropped
// packets to it (Isolate), and brings its link up.
func (h *Host) Heal() error {
	if err := h.ClearDrops(); err != nil {
		return err
	}
	for _, o := range h.lab.Hosts {
		if o != h {
			if err := o.ClearDrops(); err != nil {
				return err
			}
		}
	}
	return h.LinkUp()
}

// ClearDrops removes the host's own fault rules.
func (h *Host) ClearDrops() error {
	cmd := h.Command("nft", "list", "table", "inet", "netlab")
	if err := cmd.Run(); err != nil {
		return nil // no table: nothing to clear
	}
	return h.nft("delete table inet netlab\n")
}

// Dropped is the number of packets the host's fault rules have dropped
// since they were added (nftables counters), so that a test can tell that
// its fault really hit traffic.
func (h *Host) Dropped() (int, error) {
	out, err := h.Command("nft", "list", "table", "inet", "netlab").CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "No such file") {
			return 0, nil // no rules
		}
		return 0, fmt.Errorf("netlab: nft list on %s: %w: %s", h.Name, err, strings.TrimSpace(string(out)))
	}
	n := 0
	f := strings.Fields(string(out))
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "packets" {
			v, err := strconv.Atoi(f[i+1])
			if err != nil {
				return 0, fmt.Errorf("netlab: nft counter %q on %s: %w", f[i+1], h.Name, err)
			}
			n += v
		}
	}
	return n, nil
}

// LinkDown takes the host's interface down: nothing goes in or out.
func (h *Host) LinkDown() error { return ipCmd("-n", h.NS, "link", "set", h.veth, "down") }

// LinkUp brings the host's interface back.
func (h *Host) LinkUp() error { return ipCmd("-n", h.NS, "link", "set", h.veth, "up") }

func (h *Host) nft(script string) error {
	cmd := h.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("netlab: nft on %s: %w: %s\n%s", h.Name, err, strings.TrimSpace(string(out)), script)
	}
	return nil
}

// Port parses the port of a host:port address, or returns 0.
func Port(addr string) int {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return 0
	}
	p, err := strconv.Atoi(addr[i+1:])
	if err != nil {
		return 0
	}
	return p
}
