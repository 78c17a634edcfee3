package router

import (
	"encoding/json"
	"math"
	"net/http"
)

// ContextLimit is the longest prompt + completion, in tokens, that every
// live engine of model can hold (0: no engine says): each engine's
// registered max_model_len, lowered to what its KV region holds
// (blocks_total × block_size). The router advertises it as max_model_len
// in /v1/models, as vLLM does, and refuses longer requests before their
// prefill: a request one engine cannot hold would fail on the engine
// picked for it, after a prefill, or not, depending on the pick.
func ContextLimit(engines []Engine, model string) int {
	limit := 0
	for _, e := range engines {
		if e.Info.GetModel() != model {
			continue
		}
		l := int(e.Info.GetMaxModelLen())
		if t, bs := e.Info.GetBlocksTotal(), e.Info.GetBlockSize(); t > 0 && bs > 0 {
			if held := int(t) * int(bs); l == 0 || held < l {
				l = held
			}
		}
		if l > 0 && (limit == 0 || l < limit) {
			limit = l
		}
	}
	return limit
}

// promptTokens is the length of a prompt given as token ids (0: a text
// prompt or chat messages, whose length only an engine's tokenizer knows).
func promptTokens(c *ClientRequest) int {
	if c.Kind != Completions {
		return 0
	}
	raw := c.Body["prompt"]
	if len(raw) == 0 || raw[0] != '[' { // a text prompt (re-encoded: no leading space)
		return 0
	}
	var ids tokenIDs
	if json.Unmarshal(raw, &ids) != nil {
		return 0
	}
	return len(ids)
}

// CheckContext refuses a request longer than limit tokens with OpenAI's
// 400 context_length_exceeded, naming the prompt's length and the limit.
// prompt is the prompt's length in tokens (0: not known yet, at least 1).
// A prompt that alone leaves no room for one token is the prompt's fault,
// whatever max_tokens says; otherwise prompt + max_tokens over the limit
// is max_tokens'.
func CheckContext(c *ClientRequest, prompt, limit int) *APIError {
	if limit <= 0 {
		return nil
	}
	if prompt >= limit {
		param := "prompt"
		if c.Kind == Chat {
			param = "messages"
		}
		return contextError(param, "This model's maximum context length is %d tokens. However, your prompt has %d tokens. Please reduce the length of the prompt.", limit, prompt)
	}
	if c.MaxTokens == 0 {
		return nil
	}
	param := "max_tokens"
	if _, ok := c.Body["max_tokens"]; !ok && c.Kind == Chat {
		param = "max_completion_tokens"
	}
	// Compared without adding: a max_tokens near the int range would wrap
	// a sum and pass.
	if prompt == 0 {
		if c.MaxTokens > limit-1 {
			return contextError(param, "This model's maximum context length is %d tokens. However, you requested %d tokens in the completion, and the prompt has at least 1. Please reduce %s.", limit, c.MaxTokens, param)
		}
		return nil
	}
	if c.MaxTokens > limit-prompt {
		return contextError(param, "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d in the completion). Please reduce the length of the prompt or completion.", limit, prompt+min(c.MaxTokens, math.MaxInt-prompt), prompt, c.MaxTokens)
	}
	return nil
}

func contextError(param, format string, args ...any) *APIError {
	e := badRequest(param, format, args...)
	e.Status, e.Code = http.StatusBadRequest, CodeContextLength
	return e
}
