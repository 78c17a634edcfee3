package advertise

import (
	"context"
	"errors"
	"net/netip"
	"testing"
)

// TestHostPolicy: an engine's base_url must name this machine: a loopback
// or local address, a name that resolves only to such addresses, or a name
// the operator listed; another machine's address, a name that also
// resolves elsewhere, or one that does not resolve is refused.
func TestHostPolicy(t *testing.T) {
	local := map[string]bool{"127.0.0.1": true, "::1": true, "10.0.0.7": true}
	p := HostPolicy{
		Local: func(a netip.Addr) bool { return local[a.String()] },
		Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
			switch host {
			case "localhost":
				return []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("::1")}, nil
			case "me":
				return []netip.Addr{netip.MustParseAddr("::ffff:10.0.0.7")}, nil
			case "split":
				return []netip.Addr{netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("10.9.9.9")}, nil
			}
			return nil, errors.New("no such host")
		},
		Allowed: []string{"engine-svc"},
	}
	for url, ok := range map[string]bool{
		"http://127.0.0.1:8100":     true,
		"http://[::1]:8100":         true,
		"https://10.0.0.7":          true,
		"http://localhost:8000":     true,
		"http://me:1":               true,
		"http://ENGINE-SVC:80":      true,
		"http://10.9.9.9:8100":      false,
		"http://169.254.169.254/":   false,
		"http://split:8100":         false,
		"http://nowhere.invalid:80": false,
	} {
		err := p.Check(context.Background(), url)
		if (err == nil) != ok {
			t.Errorf("%s: %v, want ok=%v", url, err, ok)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v is not ErrInvalid", url, err)
		}
	}
	p.Allowed = []string{"*"}
	if err := p.Check(context.Background(), "http://10.9.9.9:8100"); err != nil {
		t.Fatalf("engine_url_hosts=*: %v", err)
	}
}
