package router

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestEngineRedirectIsNotFollowed: an engine that answers a redirect to
// another host (its base_url is its own word) does not get the router to
// post there — the net/http client the router uses for https engines,
// /tokenize and stop-string checks returns the 3xx as the answer.
func TestEngineRedirectIsNotFollowed(t *testing.T) {
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		elsewhere.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	defer other.Close()
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+"/collect", http.StatusTemporaryRedirect)
	}))
	defer engine.Close()
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	s := newTestRouter(t, p)
	for _, send := range []func() (*http.Response, error){
		func() (*http.Response, error) {
			return s.client.Post(engine.URL+"/tokenize", "application/json", strings.NewReader(`{"prompt":"a secret"}`))
		},
		func() (*http.Response, error) {
			r, err := s.up.viaNetHTTP(t.Context(), http.MethodPost, engine.URL+"/v1/completions", []byte(`{"prompt":"a secret"}`), "")
			if err != nil {
				return nil, err
			}
			return &http.Response{StatusCode: r.Status, Body: r.Body}, nil
		},
	} {
		resp, err := send()
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusTemporaryRedirect {
			t.Fatalf("status %d, want the engine's own 307", resp.StatusCode)
		}
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("the redirect's target got %d requests from the router, want none", n)
	}
}
