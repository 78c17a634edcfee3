package daemon

import (
	"testing"

	"github.com/connex/connex/api"
	"github.com/connex/connex/config"
)

// TestRequestBoundDefaultsAgree: connexd's max_request_bytes default and
// the API service's own (a ServeOptions that leaves MaxRequestBytes at 0)
// are the same bound, so that one cannot drift from the other.
func TestRequestBoundDefaultsAgree(t *testing.T) {
	cfg, err := config.Load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MaxRequestBytes != api.DefaultMaxRequestBytes {
		t.Fatalf("max_request_bytes defaults to %d, api.DefaultMaxRequestBytes is %d", cfg.MaxRequestBytes, api.DefaultMaxRequestBytes)
	}
}
