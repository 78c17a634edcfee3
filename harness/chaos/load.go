package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"
)

// Record is what one client request saw, end to end through the router.
type Record struct {
	N         int    `json:"n"`          // index in the load, from 0
	RequestID string `json:"request_id"` // X-Connex-Request-Id
	Prompt    int    `json:"prompt"`     // index into the prompt pool
	Chat      bool   `json:"chat"`
	Stream    bool   `json:"stream"`
	// Times since the load started.
	Start      time.Duration `json:"start_ns"`
	FirstToken time.Duration `json:"first_token_ns"` // 0 when none arrived
	End        time.Duration `json:"end_ns"`
	Text       string        `json:"-"`
	Chunks     int           `json:"chunks"`
	Status     int           `json:"status"`          // HTTP status (200 for a stream that ended in an error event)
	Err        string        `json:"error,omitempty"` // the error a client saw: its message, code and type
	// Lost: no answer and no error a client could act on (a connection
	// that broke or hung without an error body or event, a stream without
	// [DONE]).
	Lost bool `json:"lost,omitempty"`
	// Transport: the connection to the router failed or broke (refused,
	// reset, cut mid-stream), as it does while the router is down.
	Transport bool `json:"transport,omitempty"`
	// From the connex object of the answer (non-streamed, or the usage
	// chunk of a stream).
	Prefills      int      `json:"prefills"`
	Resumes       int      `json:"resumes"`
	KVLoad        string   `json:"kv_load,omitempty"`
	PrefillEngine string   `json:"prefill_engine,omitempty"`
	DecodeEngines []string `json:"decode_engines,omitempty"`
	TransferID    string   `json:"transfer_id,omitempty"`
	// Gaps are pauses between streamed chunks longer than the gap
	// threshold: where a resume happened (start and length).
	Gaps []Gap `json:"gaps,omitempty"`
	// MaxGap is the longest pause between two streamed chunks: for a
	// resumed stream, what the failover cost the client.
	MaxGap time.Duration `json:"max_gap_ns,omitempty"`
}

// Gap is a pause in a stream.
type Gap struct {
	At  time.Duration `json:"at_ns"`
	Len time.Duration `json:"len_ns"`
}

// Completed reports whether the request got its whole answer.
func (r *Record) Completed() bool { return !r.Lost && r.Err == "" }

// promptText is prompt i of the pool: deterministic words, n bytes (the
// simulated engine's tokenizer takes one token per byte).
func promptText(seed int64, i, n int) string {
	rng := rand.New(rand.NewPCG(uint64(seed), uint64(i)+1))
	words := []string{"chaos", "resume", "token", "prefill", "decode", "hold", "lease", "pull", "block", "engine", "router", "member"}
	var b strings.Builder
	fmt.Fprintf(&b, "p%d", i)
	for b.Len() < n {
		b.WriteByte(' ')
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()[:n]
}

// request is one request the load sends.
type request struct {
	n, prompt    int
	chat, stream bool
}

// body is the OpenAI request body.
func (q request) body(model, prompt string, maxTokens int) []byte {
	m := map[string]any{"model": model, "max_tokens": maxTokens, "stream": q.stream}
	if q.stream {
		m["stream_options"] = map[string]any{"include_usage": true}
	}
	if q.chat {
		m["messages"] = []map[string]string{{"role": "user", "content": prompt}}
	} else {
		m["prompt"] = prompt
	}
	b, _ := json.Marshal(m)
	return b
}

// client sends requests to the router and records what came back.
type client struct {
	http      *http.Client
	router    string
	model     string
	maxTokens int
	gapMin    time.Duration // a pause this long in a stream is a gap
	t0        time.Time
}

type connexObj struct {
	RequestID     string   `json:"request_id"`
	Prefills      int      `json:"prefills"`
	Resumes       int      `json:"resumes"`
	KVLoad        string   `json:"kv_load"`
	PrefillEngine string   `json:"prefill_engine"`
	DecodeEngines []string `json:"decode_engines"`
	TransferID    string   `json:"transfer_id"`
}

type apiErr struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Code    any    `json:"code"`
}

func (e *apiErr) String() string {
	return fmt.Sprintf("%s (code %v, type %s)", e.Message, e.Code, e.Type)
}

type answer struct {
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Connex *connexObj `json:"connex"`
	Error  *apiErr    `json:"error"`
}

func (a *answer) text() string {
	if len(a.Choices) == 0 {
		return ""
	}
	c := a.Choices[0]
	return c.Text + c.Message.Content + c.Delta.Content
}

func (r *Record) connex(c *connexObj) {
	if c == nil {
		return
	}
	r.Prefills, r.Resumes, r.KVLoad = c.Prefills, c.Resumes, c.KVLoad
	r.PrefillEngine, r.DecodeEngines, r.TransferID = c.PrefillEngine, c.DecodeEngines, c.TransferID
	if r.RequestID == "" {
		r.RequestID = c.RequestID
	}
}

// do sends q and records the outcome; ctx bounds it (a request still
// unanswered then is lost).
func (c *client) do(ctx context.Context, q request, prompt string) *Record {
	r := &Record{N: q.n, Prompt: q.prompt, Chat: q.chat, Stream: q.stream, Start: time.Since(c.t0)}
	defer func() { r.End = time.Since(c.t0) }()
	path := "/v1/completions"
	if q.chat {
		path = "/v1/chat/completions"
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.router+path, bytes.NewReader(q.body(c.model, prompt, c.maxTokens)))
	if err != nil {
		r.Lost, r.Err = true, err.Error()
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		r.Lost, r.Transport, r.Err = true, true, "no answer: "+err.Error()
		return r
	}
	defer resp.Body.Close()
	r.Status = resp.StatusCode
	r.RequestID = resp.Header.Get("X-Connex-Request-Id")
	if resp.StatusCode != http.StatusOK || !q.stream {
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			r.Lost, r.Err = true, fmt.Sprintf("HTTP %d, body broke: %v", resp.StatusCode, err)
			return r
		}
		var a answer
		if jerr := json.Unmarshal(body, &a); jerr != nil {
			r.Lost, r.Err = true, fmt.Sprintf("HTTP %d, not JSON: %.200q", resp.StatusCode, body)
			return r
		}
		if resp.StatusCode != http.StatusOK {
			if a.Error == nil || a.Error.Message == "" {
				r.Lost, r.Err = true, fmt.Sprintf("HTTP %d without an error message: %.200q", resp.StatusCode, body)
				return r
			}
			r.Err = fmt.Sprintf("HTTP %d: %s", resp.StatusCode, a.Error)
			return r
		}
		r.Text, r.Chunks = a.text(), 1
		r.connex(a.Connex)
		return r
	}
	c.readStream(resp.Body, r)
	return r
}

// readStream reads an SSE answer up to [DONE].
func (c *client) readStream(body io.Reader, r *Record) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var text strings.Builder
	var last time.Duration
	done := false
	for sc.Scan() {
		line := sc.Text()
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			done = true
			break
		}
		var a answer
		if err := json.Unmarshal([]byte(data), &a); err != nil {
			r.Lost, r.Err = true, fmt.Sprintf("a stream event that is not JSON: %.200q", data)
			return
		}
		if a.Error != nil {
			r.Err = "error event: " + a.Error.String()
			continue
		}
		r.connex(a.Connex)
		if t := a.text(); t != "" {
			now := time.Since(c.t0)
			if r.FirstToken == 0 {
				r.FirstToken = now
			} else {
				r.MaxGap = max(r.MaxGap, now-last)
				if now-last >= c.gapMin {
					r.Gaps = append(r.Gaps, Gap{At: last, Len: now - last})
				}
			}
			last = now
			text.WriteString(t)
			r.Chunks++
		}
	}
	r.Text = text.String()
	if !done {
		err := sc.Err()
		if err == nil {
			err = errors.New("EOF")
		}
		r.Lost, r.Transport = true, true
		if r.Err == "" {
			r.Err = "stream ended without [DONE]: " + err.Error()
		}
	}
}
