package router

import (
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// scriptEngine is a decode engine that streams the chunks of script as
// they are, then [DONE]; it stops when the router no longer reads. It is a
// fakeEngine (for newTestRouter) with its own server.
func scriptEngine(t *testing.T, id string, script iter.Seq[string]) *fakeEngine {
	f := &fakeEngine{t: t, id: id, role: "decode"}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		var body map[string]any
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Errorf("%s: body: %v", id, err)
			return
		}
		f.mu.Lock()
		f.bodies = append(f.bodies, body)
		f.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		for c := range script {
			if _, err := fmt.Fprintf(w, "data: %s\n\n", c); err != nil {
				return
			}
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// scriptRouter is a router in front of a prefill engine and a decode
// engine that streams script.
func scriptRouter(t *testing.T, script ...string) *Server {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	return newTestRouter(t, p, scriptEngine(t, "d", slices.Values(script)))
}

// post posts body to the router's path and returns the status and the answer.
func post(t *testing.T, s *Server, path, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(s.URL()+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(data)
}

// TestPlainChunksKeepTheirBytes: vLLM's plain chunks — with its null
// logprobs, a stop_reason, a role delta — come out byte for byte as they
// did before the router relayed extras (the expected answers were taken
// from the router before that change).
func TestPlainChunksKeepTheirBytes(t *testing.T) {
	varying := regexp.MustCompile(`"id":"[a-z]+-[0-9a-f]+","object":"([a-z._]+)","created":[0-9]+`)
	for _, c := range []struct {
		name, path, body string
		script           []string
		want             string
	}{{
		name: "chat", path: "/v1/chat/completions",
		body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3,"stream":true,"return_token_ids":true}`,
		script: []string{
			`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}],"prompt_token_ids":[1,2,3]}`,
			`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" a<b>"},"logprobs":null,"finish_reason":null,"token_ids":[7]}]}`,
			`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"\n\u00e9"},"finish_reason":null,"token_ids":[8]}]}`,
			`{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","stop_reason":null,"token_ids":[9]}]}`,
		},
		want: `data: {"id":"ID","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}

data: {"id":"ID","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":" a\u003cb\u003e"},"logprobs":null,"finish_reason":null,"token_ids":[7]}]}

data: {"id":"ID","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":"\né"},"logprobs":null,"finish_reason":null,"token_ids":[8]}]}

data: {"id":"ID","object":"chat.completion.chunk","created":0,"model":"m","choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","token_ids":[9]}]}

data: [DONE]

`,
	}, {
		name: "completions", path: "/v1/completions",
		body: `{"model":"m","prompt":"abc","max_tokens":2,"stream":true}`,
		script: []string{
			`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" x","logprobs":null,"finish_reason":null,"token_ids":[7]}]}`,
			`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" y","logprobs":null,"finish_reason":"length","stop_reason":null,"token_ids":[8]}]}`,
		},
		want: `data: {"id":"ID","object":"text_completion","created":0,"model":"m","choices":[{"index":0,"text":" x","logprobs":null,"finish_reason":null}]}

data: {"id":"ID","object":"text_completion","created":0,"model":"m","choices":[{"index":0,"text":" y","logprobs":null,"finish_reason":"length"}]}

data: [DONE]

`,
	}, {
		name: "chat-whole", path: "/v1/chat/completions",
		body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":3}`,
		script: []string{
			`{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
			`{"choices":[{"index":0,"delta":{"content":""},"logprobs":null,"finish_reason":"stop","token_ids":[9]}]}`,
		},
		want: `{"id":"ID","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":""},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4},"connex":{"decode_engines":["d"],"prefill_engine":"p","prefills":1,"request_id":"RID","resumes":0}}`,
	}} {
		t.Run(c.name, func(t *testing.T) {
			status, got := post(t, scriptRouter(t, c.script...), c.path, c.body)
			got = varying.ReplaceAllString(got, `"id":"ID","object":"$1","created":0`)
			got = regexp.MustCompile(`"request_id":"[^"]*"`).ReplaceAllString(got, `"request_id":"RID"`)
			if status != http.StatusOK || got != c.want {
				t.Fatalf("status %d, answer:\n%s\nwant:\n%s", status, got, c.want)
			}
		})
	}
}
