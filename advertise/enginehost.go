package advertise

import (
	"context"
	"fmt"
	"net/netip"
	"net/url"
	"slices"
	"strings"
)

// HostPolicy decides whether an engine's base_url names its own host: the
// router posts clients' prompts to that URL, so an engine must not point it
// at another machine. An engine runs beside its connexd, so its own host is
// connexd's: every address the URL's host stands for must be one of this
// machine's (Local), unless the operator listed the host name itself
// (Allowed, the engine_url_hosts setting: a service name, a NAT'd address).
// "*" in Allowed turns the check off.
type HostPolicy struct {
	// Local reports whether addr is an address of this machine.
	Local func(addr netip.Addr) bool
	// Resolve returns the addresses a host name stands for.
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Allowed are host names (or addresses) accepted as they are.
	Allowed []string
}

// Check returns nil when baseURL's host is the engine's own (the URL
// itself passed Validate), else an error that says what to do.
func (p HostPolicy) Check(ctx context.Context, baseURL string) error {
	if slices.Contains(p.Allowed, "*") {
		return nil
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		return fmt.Errorf("%w: base_url %q: %v", ErrInvalid, baseURL, err)
	}
	host := strings.ToLower(u.Hostname())
	for _, a := range p.Allowed {
		if strings.EqualFold(a, host) {
			return nil
		}
	}
	var addrs []netip.Addr
	if a, err := netip.ParseAddr(host); err == nil {
		addrs = []netip.Addr{a}
	} else {
		if addrs, err = p.Resolve(ctx, host); err != nil {
			return fmt.Errorf("%w: base_url %q: its host does not resolve: %v", ErrInvalid, baseURL, err)
		}
		if len(addrs) == 0 {
			return fmt.Errorf("%w: base_url %q: its host resolves to no address", ErrInvalid, baseURL)
		}
	}
	for _, a := range addrs {
		if !p.Local(a.Unmap()) {
			return fmt.Errorf("%w: base_url %q: %s is not an address of this engine's host (connexd's machine); an engine's URL must name its own host, or the host must be listed in engine_url_hosts", ErrInvalid, baseURL, a)
		}
	}
	return nil
}
