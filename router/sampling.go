package router

import (
	"encoding/json"
	"math"
)

// samplingRange is the values one sampling field may take, as vLLM's
// SamplingParams checks them (the engine that would otherwise refuse the
// request only after its prefill ran). OpenAI's own API is narrower for
// temperature (at most 2); vLLM accepts more and the router does too, so a
// client that works against vLLM works through the router.
type samplingRange struct {
	key      string
	min, max float64
	// minOpen / maxOpen: the bound itself is not allowed.
	minOpen, maxOpen bool
	integer          bool
	want             string // the allowed values, for the message
}

var samplingRanges = []samplingRange{
	{key: "temperature", min: 0, max: math.Inf(1), want: "at least 0"},
	{key: "top_p", min: 0, max: 1, minOpen: true, want: "in (0, 1]"},
	{key: "top_k", min: -1, max: math.Inf(1), integer: true, want: "-1 or 0 (off), or at least 1"},
	{key: "min_p", min: 0, max: 1, want: "in [0, 1]"},
	{key: "presence_penalty", min: -2, max: 2, want: "in [-2, 2]"},
	{key: "frequency_penalty", min: -2, max: 2, want: "in [-2, 2]"},
	{key: "repetition_penalty", min: 0, max: math.Inf(1), minOpen: true, want: "greater than 0"},
	{key: "min_tokens", min: 0, max: math.Inf(1), integer: true, want: "at least 0"},
}

// checkSampling refuses sampling fields a vLLM engine would refuse, before
// the request costs a prefill: a value out of its range, or not a number.
// maxTokens is the request's limit on generated tokens (0: none).
func checkSampling(body map[string]json.RawMessage, maxTokens int) *APIError {
	for _, r := range samplingRanges {
		raw, ok := body[r.key]
		if !ok || isNull(raw) {
			continue
		}
		var v float64
		if err := json.Unmarshal(raw, &v); err != nil {
			return badRequest(r.key, "%s must be a number %s, got %s", r.key, r.want, raw)
		}
		low := v < r.min || (r.minOpen && v == r.min)
		high := v > r.max || (r.maxOpen && v == r.max)
		if low || high || (r.integer && v != math.Trunc(v)) || math.IsNaN(v) {
			return badRequest(r.key, "%s must be %s, got %s", r.key, r.want, raw)
		}
	}
	var minTokens int
	if field(body, "min_tokens", &minTokens) == nil && maxTokens > 0 && minTokens > maxTokens {
		return badRequest("min_tokens", "min_tokens (%d) must be at most max_tokens (%d)", minTokens, maxTokens)
	}
	return nil
}
