package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// instantEngine is an OpenAI server that answers at once, shaped as a vLLM
// P/D engine: a prefill request (kv_transfer_params.do_remote_decode, or
// max_tokens 1 and not streamed) gets a one-token completion with
// prompt_token_ids and kv_transfer_params; a decode request gets its
// tokens streamed, one event each, then a usage event when asked and
// [DONE]. It stands behind routers in make bench-router, where all a
// router's time is the router's own: the answers are prepared once and
// written with no work per token.
type instantEngine struct {
	ln      net.Listener
	srv     *http.Server
	prefill []byte // the prefill answer
	stream  []byte // the decode stream, without its usage event and [DONE]
	usage   []byte
	served  atomic.Int64
	bad     atomic.Int64 // requests it could not read
	// noKV counts decode requests without kv_transfer_params: a P/D router
	// must forward the prefill's.
	noKV atomic.Int64
}

// instantTokens is how many tokens an instant engine's decode stream carries.
const instantTokens = 16

// startInstantEngine starts an instant engine for model on 127.0.0.1; it
// stops with the test.
func startInstantEngine(t testing.TB, model string) *instantEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &instantEngine{ln: ln}
	promptIDs := make([]uint32, 32)
	for i := range promptIDs {
		promptIDs[i] = uint32(100 + i)
	}
	var err1 error
	e.prefill, err1 = json.Marshal(map[string]any{
		"id": "cmpl-instant", "object": "text_completion", "created": 1, "model": model,
		"choices": []any{map[string]any{"index": 0, "text": " a", "logprobs": nil, "finish_reason": "length",
			"token_ids": []uint32{7}, "prompt_token_ids": promptIDs}},
		"usage": map[string]int{"prompt_tokens": len(promptIDs), "completion_tokens": 1, "total_tokens": len(promptIDs) + 1},
		"kv_transfer_params": map[string]any{"do_remote_prefill": true, "do_remote_decode": false,
			"transfer_id": "00000000000000000000000000000000", "remote_engine_id": "prefill-0",
			"remote_block_ids": []int{0, 1}, "remote_num_tokens": len(promptIDs), "tp_size": 1, "block_size": 16},
	})
	var sb strings.Builder
	for i := range instantTokens {
		var finish any
		if i == instantTokens-1 {
			finish = "length"
		}
		chunk, err := json.Marshal(map[string]any{"id": "cmpl-instant", "object": "text_completion", "created": 1, "model": model,
			"choices": []any{map[string]any{"index": 0, "text": fmt.Sprintf(" t%d", i), "logprobs": nil, "finish_reason": finish,
				"token_ids": []uint32{uint32(1000 + i)}}}})
		err1 = errors.Join(err1, err)
		sb.WriteString("data: ")
		sb.Write(chunk)
		sb.WriteString("\n\n")
	}
	e.stream = []byte(sb.String())
	usage, err := json.Marshal(map[string]any{"id": "cmpl-instant", "object": "text_completion", "created": 1, "model": model,
		"choices": []any{}, "usage": map[string]int{"prompt_tokens": len(promptIDs), "completion_tokens": instantTokens,
			"total_tokens": len(promptIDs) + instantTokens}})
	e.usage = []byte("data: " + string(usage) + "\n\n")
	if err1 = errors.Join(err1, err); err1 != nil {
		t.Fatal(err1)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/v1/models", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","created":0,"owned_by":"instant","max_model_len":4096}]}`, model)
	})
	mux.HandleFunc("/v1/completions", e.complete)
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = e.srv.Serve(ln) }()
	t.Cleanup(func() { _ = e.srv.Close() })
	return e
}

// URL is the engine's base URL.
func (e *instantEngine) URL() string { return "http://" + e.ln.Addr().String() }

func (e *instantEngine) complete(w http.ResponseWriter, r *http.Request) {
	data, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	var req struct {
		Stream        bool `json:"stream"`
		MaxTokens     int  `json:"max_tokens"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		KV *struct {
			DoRemoteDecode  bool `json:"do_remote_decode"`
			DoRemotePrefill bool `json:"do_remote_prefill"`
		} `json:"kv_transfer_params"`
	}
	if err != nil || json.Unmarshal(data, &req) != nil {
		e.bad.Add(1)
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, `{"error":{"message":"not a completion request","type":"invalid_request_error","code":400}}`)
		return
	}
	e.served.Add(1)
	if (req.KV != nil && req.KV.DoRemoteDecode) || (!req.Stream && req.MaxTokens == 1) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(e.prefill)
		return
	}
	if req.KV == nil || !req.KV.DoRemotePrefill {
		e.noKV.Add(1)
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(e.stream)
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		_, _ = w.Write(e.usage)
	}
	_, _ = io.WriteString(w, "data: [DONE]\n\n")
}
