package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// httpDo sends one request with "Authorization: Bearer key" (if key is set)
// and returns the status, headers and body.
func httpDo(t *testing.T, method, url, key, body string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
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

// errorOf reads an OpenAI error body's code and param.
func errorOf(body string) (code, param string) {
	var e struct {
		Error struct {
			Code  string  `json:"code"`
			Param *string `json:"param"`
		} `json:"error"`
	}
	_ = json.Unmarshal([]byte(body), &e)
	if e.Error.Param != nil {
		param = *e.Error.Param
	}
	return e.Error.Code, param
}

// TestRouterHTTPAttacks replays issue 29's HTTP findings against a router
// and real engines (connexd, connex-sim, embedded NATS: separate
// processes): a client without the API key, a client-supplied
// kv_transfer_params under a folded key, an engine list asked for by a
// stranger, unknown model names as metric labels, a body that never ends,
// and more requests than the router admits.
func TestRouterHTTPAttacks(t *testing.T) {
	const key = "e2e-client-key-0123456789"
	c := startProduct(t, func(o *localcluster.Options) {
		o.APIKey = key
		o.RouterArgs = append(o.RouterArgs, "--router-read-timeout-ms", "500", "--router-max-in-flight", "2")
	})
	u := c.RouterURL()
	completion := `{"model":"connex-sim","prompt":"The quick brown fox","max_tokens":8,"stream":true,"stream_options":{"include_usage":true}}`

	t.Run("api key", func(t *testing.T) {
		for _, k := range []string{"", "bogus", key + "x", c.AdminKey()} {
			status, h, body := httpDo(t, "POST", u+"/v1/completions", k, completion)
			if code, _ := errorOf(body); status != 401 || code != "invalid_api_key" || h.Get("WWW-Authenticate") == "" {
				t.Errorf("key %q: %d %s; want 401 invalid_api_key", k, status, body)
			}
		}
		if status, _, body := httpDo(t, "GET", u+"/v1/models", "", ""); status != 401 {
			t.Errorf("GET /v1/models without a key: %d %s", status, body)
		}
		status, _, body := httpDo(t, "POST", u+"/v1/completions", key, completion)
		if status != 200 || !strings.Contains(body, "[DONE]") {
			t.Fatalf("with the key: %d %s", status, body)
		}
		if strings.Contains(body, "transfer_id") {
			t.Fatalf("the client's answer names its transfer:\n%s", body)
		}
	})

	t.Run("folded kv_transfer_params", func(t *testing.T) {
		before := engineMetric(t, c, "prefill", "connex_sim_prefills_total")
		victim := `{"do_remote_prefill":true,"transfer_id":"00000000000000000000000000000000","connex_request_id":"cmpl-victim","connex_resume":true}`
		for _, b := range []struct{ body, param string }{
			{`{"model":"connex-sim","prompt":"hi","max_tokens":4,"\u212Av_transfer_params":` + victim + `}`, "\u212Av_transfer_params"},
			{`{"model":"connex-sim","prompt":"hi","max_tokens":4,"KV_TRANSFER_PARAMS":` + victim + `}`, "KV_TRANSFER_PARAMS"},
			{`{"model":"connex-sim","prompt":"hi","prompt":[1,2],"max_tokens":4}`, "prompt"},
		} {
			status, _, body := httpDo(t, "POST", u+"/v1/completions", key, b.body)
			if code, param := errorOf(body); status != 400 || code != "invalid_request" || param != b.param {
				t.Errorf("%s: %d %s; want 400 naming %q", b.body, status, body, b.param)
			}
		}
		if after := engineMetric(t, c, "prefill", "connex_sim_prefills_total"); after != before {
			t.Fatalf("refused bodies reached the prefill engine: %v prefills, were %v", after, before)
		}
	})

	t.Run("engine list", func(t *testing.T) {
		for _, k := range []string{"", key} {
			if status, _, body := httpDo(t, "GET", u+"/connex/v1/engines", k, ""); status != 401 || strings.Contains(body, "127.0.0.1") {
				t.Errorf("engine list with key %q: %d %s; want 401", k, status, body)
			}
			if status, _, _ := httpDo(t, "GET", u+"/metrics", k, ""); status != 401 {
				t.Errorf("/metrics with key %q: %d; want 401", k, status)
			}
		}
		status, _, body := httpDo(t, "GET", u+"/connex/v1/engines", c.AdminKey(), "")
		if status != 200 {
			t.Fatalf("engine list with the admin key: %d %s", status, body)
		}
		for _, e := range c.Engines() {
			if !strings.Contains(body, e.URL) {
				t.Errorf("the admin's engine list lacks %s at %s: %s", e.Name, e.URL, body)
			}
		}
	})

	t.Run("model labels", func(t *testing.T) {
		for i := 0; i < 5; i++ {
			name := fmt.Sprintf("zz-unknown-%d-%s", i, strings.Repeat("m", 64<<10))
			if status, _, body := httpDo(t, "POST", u+"/v1/completions", key, `{"model":"`+name+`","prompt":"a"}`); status != 404 {
				t.Fatalf("unknown model: %d %.200s", status, body)
			}
		}
		status, _, m := httpDo(t, "GET", u+"/metrics", c.AdminKey(), "")
		if status != 200 || strings.Contains(m, "zz-unknown") || !strings.Contains(m, `model="unknown"`) {
			t.Fatalf("/metrics (%d, %d bytes) names unknown models, or counts them nowhere", status, len(m))
		}
	})

	t.Run("slow body", func(t *testing.T) {
		conn, err := net.Dial("tcp", strings.TrimPrefix(u, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 100000\r\n\r\n{\"model\":", key)
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, err = conn.Read(make([]byte, 512))
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatal("a body stalled after 9 bytes still holds its connection after 10 s (router_read_timeout_ms 500)")
		}
	})

	t.Run("admission", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		started := make(chan struct{}, 2)
		slow := map[string]any{"model": "connex-sim", "prompt": "a long answer", "max_tokens": 300, "stream": true}
		for i := 0; i < 2; i++ {
			go func() {
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, u+"/v1/completions", strings.NewReader(mustMarshal(slow)))
				req.Header.Set("Authorization", "Bearer "+key)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return
				}
				defer resp.Body.Close()
				if resp.StatusCode == 200 {
					started <- struct{}{}
				}
				_, _ = io.Copy(io.Discard, resp.Body)
			}()
		}
		for i := 0; i < 2; i++ {
			select {
			case <-started:
			case <-time.After(30 * time.Second):
				t.Fatal("the two slow streams did not start")
			}
		}
		status, h, body := httpDo(t, "POST", u+"/v1/completions", key, completion)
		if code, _ := errorOf(body); status != 503 || code != "overloaded" || h.Get("Retry-After") == "" {
			t.Fatalf("a third request with router_max_in_flight 2: %d (Retry-After %q) %s; want 503 overloaded", status, h.Get("Retry-After"), body)
		}
		cancel()
		checkFor(t, 10*time.Second, 20*time.Millisecond, func() error {
			if status, _, body := httpDo(t, "POST", u+"/v1/completions", key, completion); status != 200 {
				return fmt.Errorf("after the streams ended: %d %.200s", status, body)
			}
			return nil
		})
	})
}

func mustMarshal(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}
