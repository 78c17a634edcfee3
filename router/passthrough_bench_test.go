package router

import (
	"net/http"
	"testing"
)

// discardWriter is a ResponseWriter that keeps nothing: the benchmarks
// measure the relay, not a recorder's buffer.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header {
	if w.h == nil {
		w.h = http.Header{}
	}
	return w.h
}
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Flush()                      {}

// benchRelay is what the leg does with one parsed engine chunk.
func benchRelay(e *emitter, ch *engineChunk) {
	e.tokens(ch.text(), ch.Choices[0].TokenIDs, ch.Choices[0].FinishReason, ch.extras())
}

// benchChunks relays data, one engine chunk, b.N times: parse and emit, the
// relay's cost per token. Every 16 chunks (a short answer) the answer's
// buffers start again, so that a non-streamed answer does not grow with b.N.
func benchChunks(b *testing.B, kind Kind, stream bool, data string) {
	c := &ClientRequest{Kind: kind, Model: "m", Stream: stream, ReturnTokenIDs: true}
	e := newEmitter(&discardWriter{}, c, "cmpl-0123456789abcdef", 1700000000)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	raw := []byte(data)
	for i := 0; b.Loop(); i++ {
		ch, err := parseChunk(raw)
		if err != nil {
			b.Fatal(err)
		}
		benchRelay(e, ch)
		if i%16 == 15 {
			e.text.Reset()
			e.ids, e.textIDs = e.ids[:0], 0
		}
	}
}

// BenchmarkRelayPlainChunk: a chunk with only text, token ids and a finish
// reason (the fast path), streamed and not, both endpoints.
func BenchmarkRelayPlainChunk(b *testing.B) {
	comp := `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" hello","logprobs":null,"finish_reason":null,"token_ids":[1003]}]}`
	chat := `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" hello"},"logprobs":null,"finish_reason":null,"token_ids":[1003]}]}`
	b.Run("completions-stream", func(b *testing.B) { benchChunks(b, Completions, true, comp) })
	b.Run("chat-stream", func(b *testing.B) { benchChunks(b, Chat, true, chat) })
	b.Run("completions-whole", func(b *testing.B) { benchChunks(b, Completions, false, comp) })
	b.Run("chat-whole", func(b *testing.B) { benchChunks(b, Chat, false, chat) })
}

// BenchmarkRelayExtrasChunk: a chunk with logprobs or tool calls (the
// encoding/json path), streamed and not.
func BenchmarkRelayExtrasChunk(b *testing.B) {
	lp := `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":" hello"},"logprobs":{"content":[{"token":" hello","logprob":-0.25,"bytes":[32,104,101,108,108,111],"top_logprobs":[{"token":" hello","logprob":-0.25,"bytes":[32,104,101,108,108,111]},{"token":" hi","logprob":-1.5,"bytes":[32,104,105]}]}]},"finish_reason":null,"token_ids":[1003]}]}`
	tc := `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"Paris\""}}]},"logprobs":null,"finish_reason":null,"token_ids":[1003]}]}`
	b.Run("logprobs-stream", func(b *testing.B) { benchChunks(b, Chat, true, lp) })
	b.Run("logprobs-whole", func(b *testing.B) { benchChunks(b, Chat, false, lp) })
	b.Run("tool-calls-stream", func(b *testing.B) { benchChunks(b, Chat, true, tc) })
}
