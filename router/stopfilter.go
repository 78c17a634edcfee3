package router

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"
)

// stopFilter applies a request's stop strings across a resume. vLLM holds
// back the last len(longest stop)-1 characters of a stream's text until it
// knows they do not begin a stop string (its detokenizer's stop buffer), so
// when a decode engine dies the client has seen less text than the tokens
// generated so far stand for; and the engine the request resumes on checks
// stop strings only in its own new text. The filter, fed the resumed leg's
// text, first releases what the dead engine held back (withheld: the text
// of the generated tokens beyond what was relayed), checks every stop string
// across the boundary (the relayed tail, the held-back text and the new
// text together), and holds back the same number of characters vLLM does.
// It is pure: the relay feeds it and acts on what it returns.
type stopFilter struct {
	stops   []string
	include bool   // include_stop_str_in_output: a match's stop string is emitted too
	keep    int    // characters held back: len(longest stop) - 1
	tail    string // the last keep characters already emitted (a match may start there)
	pending string // text not yet emitted
	done    bool   // a stop string matched: nothing more is emitted
}

// newStopFilter starts a filter after relayed text was emitted, with
// withheld text still owed to the client.
func newStopFilter(stops []string, include bool, relayed, withheld string) *stopFilter {
	f := &stopFilter{stops: stops, include: include, pending: withheld}
	for _, s := range stops {
		f.keep = max(f.keep, len(s)-1)
	}
	f.tail = lastBytes(relayed, f.keep)
	return f
}

// feed takes the next text of the stream (final: the engine finished it)
// and returns what to emit now, and whether a stop string matched (the
// stream then ends with finish_reason "stop").
func (f *stopFilter) feed(text string, final bool) (emit string, matched bool) {
	if f.done {
		return "", true
	}
	f.pending += text
	window := f.tail + f.pending
	at, end := -1, 0
	for _, s := range f.stops {
		if s == "" {
			continue
		}
		if i := strings.Index(window, s); i >= 0 && (at < 0 || i < at) {
			at, end = i, i+len(s)
		}
	}
	if at >= 0 {
		f.done = true
		cut := at
		if f.include {
			cut = end
		}
		if cut -= len(f.tail); cut < 0 {
			cut = 0
		}
		return f.pending[:cut], true
	}
	n := len(f.pending)
	if !final {
		n = max(0, n-f.keep)
		for n > 0 && n < len(f.pending) && !utf8.RuneStart(f.pending[n]) {
			n-- // never split a character between two chunks
		}
	}
	emit, f.pending = f.pending[:n], f.pending[n:]
	f.tail = lastBytes(f.tail+emit, f.keep)
	return emit, false
}

// lastBytes is the last n bytes of s (all of s when shorter).
func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}

// stopStrings reads a request's "stop" (a string or a list of strings) and
// include_stop_str_in_output; none when absent or malformed (the engine
// refuses a malformed one before any token).
func stopStrings(body map[string]json.RawMessage) (stops []string, include bool) {
	raw, ok := body["stop"]
	if !ok || isNull(raw) {
		return nil, false
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		if one != "" {
			stops = []string{one}
		}
	} else if json.Unmarshal(raw, &stops) != nil {
		return nil, false
	}
	_ = field(body, "include_stop_str_in_output", &include)
	return stops, include
}

// detokenizeTimeout bounds the detokenize call a resume with stop strings
// makes; the stream's stall deadline already covers the leg itself.
const detokenizeTimeout = 2 * time.Second

// withheld is the text the generated tokens stand for beyond what was
// relayed: what the failed engine held back while it checked stop strings.
// It asks engine e (the one the request resumes on, vLLM's /detokenize) for
// the text of the generated tokens. An engine without that endpoint, or a
// text that does not extend the relayed one, yields "" (logged): the answer
// then misses at most len(longest stop)-1 characters, as it did before.
func (s *Server) withheld(ctx context.Context, e Engine, model string, ids []uint32, relayed, rid string) string {
	if len(ids) == 0 {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, detokenizeTimeout)
	defer cancel()
	body, _ := json.Marshal(map[string]any{"model": model, "tokens": ids})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.Info.GetBaseUrl()+"/detokenize", bytes.NewReader(body))
	if err != nil {
		return ""
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		s.log.Warn("resume with stop strings: detokenize failed; text the failed engine held back may be missing", "request_id", rid, "engine", e.Info.GetEngineId(), "err", err)
		return ""
	}
	defer resp.Body.Close()
	var out struct {
		Prompt string `json:"prompt"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&out) != nil {
		s.log.Info("resume with stop strings: the engine does not detokenize; text the failed engine held back may be missing", "request_id", rid, "engine", e.Info.GetEngineId(), "status", resp.StatusCode)
		return ""
	}
	rest, ok := strings.CutPrefix(out.Prompt, relayed)
	if !ok {
		s.log.Warn("resume with stop strings: the generated tokens' text does not extend what was relayed", "request_id", rid, "engine", e.Info.GetEngineId(),
			"relayed_bytes", len(relayed), "text_bytes", len(out.Prompt))
		return ""
	}
	s.log.Info("resume with stop strings: text the failed engine held back is sent first", "request_id", rid, "engine", e.Info.GetEngineId(),
		"tokens", len(ids), "held_back", rest)
	return rest
}
