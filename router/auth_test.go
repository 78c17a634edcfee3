package router

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

func call(t *testing.T, method, url, key, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(data)
}

// TestAPIKeys: with api keys set, /v1/* needs one of them (401 with an
// OpenAI error body otherwise, whatever the Authorization header says);
// the operator endpoints need an admin key, not a client key; probes stay
// open; and engines' base URLs are listed to admin callers only.
func TestAPIKeys(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d := (&fakeEngine{t: t, id: "d", role: "decode"}).start()
	s := limitedRouter(t, Config{APIKeys: []string{"client-key-1", "client-key-2"}, AdminKeys: []string{"admin-key"}}, p, d)
	u := s.URL()
	completion := `{"model":"m","prompt":"abc","max_tokens":2}`
	cases := []struct {
		method, path, key, body string
		status                  int
	}{
		{"POST", "/v1/completions", "", completion, 401},
		{"POST", "/v1/completions", "bogus", completion, 401},
		{"POST", "/v1/completions", "client-key-1x", completion, 401},
		{"POST", "/v1/completions", "admin-key", completion, 401},
		{"POST", "/v1/completions", "client-key-2", completion, 200},
		{"GET", "/v1/models", "", "", 401},
		{"GET", "/v1/models", "client-key-1", "", 200},
		{"GET", "/v1/nothing", "", "", 401},
		{"GET", "/metrics", "", "", 401},
		{"GET", "/metrics", "client-key-1", "", 401},
		{"GET", "/metrics", "admin-key", "", 200},
		{"GET", "/connex/v1/engines", "", "", 401},
		{"GET", "/connex/v1/engines", "client-key-1", "", 401},
		{"GET", "/health", "", "", 200},
		{"GET", "/ready", "", "", 200},
	}
	for _, c := range cases {
		status, h, body := call(t, c.method, u+c.path, c.key, c.body)
		if status != c.status {
			t.Errorf("%s %s key %q: %d %s, want %d", c.method, c.path, c.key, status, body, c.status)
			continue
		}
		if status == 401 {
			var e struct {
				Error APIError `json:"error"`
			}
			if json.Unmarshal([]byte(body), &e) != nil || e.Error.Code != CodeUnauthorized || e.Error.Type != "invalid_request_error" ||
				e.Error.Message == "" || h.Get("WWW-Authenticate") == "" {
				t.Errorf("%s %s: 401 body %s (WWW-Authenticate %q): not an OpenAI error", c.method, c.path, body, h.Get("WWW-Authenticate"))
			}
		}
	}
	if len(p.bodies) != 1 {
		t.Fatalf("%d prefill legs, want 1 (the one authorized completion)", len(p.bodies))
	}
	_, _, list := call(t, "GET", u+"/connex/v1/engines", "admin-key", "")
	if !strings.Contains(list, p.srv.URL) {
		t.Fatalf("an admin caller does not get the engines' URLs: %s", list)
	}

	// No admin key configured: the engine list is open but names no URL,
	// and no API key configured: any Authorization header is accepted.
	open := limitedRouter(t, Config{}, p, d)
	if status, _, list := call(t, "GET", open.URL()+"/connex/v1/engines", "anything", ""); status != 200 ||
		strings.Contains(list, "base_url") || strings.Contains(list, strings.TrimPrefix(p.srv.URL, "http://")) || !strings.Contains(list, `"engine_id":"p"`) {
		t.Fatalf("engine list without admin keys: %d %s", status, list)
	}
	if status, _, body := call(t, "POST", open.URL()+"/v1/completions", "bogus", completion); status != 200 {
		t.Fatalf("no api key set: %d %s", status, body)
	}
}
