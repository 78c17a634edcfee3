package router

import (
	"encoding/json"
	"fmt"
)

// Why a request may not be resumed: the label of
// connex_router_resumes_refused_total and the start of the error's message.
const (
	// RefuseTools: a chat with tools. vLLM's chat layer (the tool parser,
	// or the JSON of a required or named tool call) turns the text into
	// delta.tool_calls; a resumed leg is a completion of token ids, which
	// does not run it.
	RefuseTools = "tools"
	// RefuseLogprobs: logprobs or top_logprobs asked. The resumed leg's
	// logprobs would be a completion's, not the endpoint's shape, for the
	// tokens after the resume only.
	RefuseLogprobs = "logprobs"
	// RefuseSeed: a seeded sampler that samples (temperature not 0). The
	// engine seeds a request's generator when the request starts, so the
	// resumed leg would draw other tokens than the uninterrupted request.
	RefuseSeed = "seeded_sampling"
	// RefusePenalties: presence_penalty or frequency_penalty. vLLM counts
	// them over the tokens the request generated, which on a resumed leg
	// sit in its prompt, where they count for nothing.
	RefusePenalties = "output_penalties"
	// RefuseBadWords: bad_words. vLLM bans a word's last token after the
	// generated tokens that begin it, which on a resumed leg sit in its
	// prompt: a word across the resume point would pass.
	RefuseBadWords = "bad_words"
	// RefuseReasoning: the engine's reasoning parser split the answer into
	// reasoning and content, or the engine runs one and the request is a
	// chat; a resumed leg is a completion that no parser splits, so the
	// rest of the reasoning would arrive as content.
	RefuseReasoning = "reasoning"
	// RefuseDiverged: a request resumed by replay (replay.go) whose resumed
	// engine, generating the answer again, drew other tokens than the
	// client has.
	RefuseDiverged = "diverged"
)

// resumeRefusal says whether a prefix resume (a completion of the prompt
// and the generated tokens) gives the answer the request would have had
// without the failure, and if not, why; such a request resumes by replay
// when it is replayable, else it is refused: reason is one of
// the Refuse* labels and why the sentence for the client. Structured
// outputs (structured_outputs, response_format) can: the resumed engine's
// connector advances the grammar over the generated tokens. Greedy and
// unseeded sampling can: a resumed leg samples from the same distribution.
//
// reasoned says that an engine's chunk carried reasoning (emitter.reasoned);
// parser is the reasoning parser the failed leg's engine registered
// (EngineInfo.reasoning_parser, "" for none): such an engine's chat layer
// parses every chat's answer (whether it reasons is the chat template's and
// the model's call, and may start after the resume point), so none of its
// chats resumes as a completion.
//
// Pure, on the fields ParseClient kept; asked only when a leg failed.
func resumeRefusal(c *ClientRequest, reasoned bool, parser string) (reason, why string) {
	b := c.Body
	if c.Kind == Chat && hasTools(b) {
		return RefuseTools, "a chat with tools: its tool calls are parsed by the engine's chat layer, which a resumed leg does not run"
	}
	if reasoned {
		return RefuseReasoning, "the engine's reasoning parser split the answer into reasoning and content, which a resumed leg (a completion) would not"
	}
	if c.Kind == Chat && parser != "" {
		return RefuseReasoning, fmt.Sprintf("the engine's chat layer runs the reasoning parser %s over the answer, which a resumed leg (a completion) would not", parser)
	}
	var lp json.RawMessage
	if field(b, "logprobs", &lp) == nil && lp != nil && string(lp) != "false" {
		return RefuseLogprobs, "logprobs were asked, and a resumed leg cannot give the same logprobs"
	}
	if raw, ok := b["top_logprobs"]; ok && !isNull(raw) {
		return RefuseLogprobs, "top_logprobs were asked, and a resumed leg cannot give the same logprobs"
	}
	if raw, ok := b["seed"]; ok && !isNull(raw) {
		var temp *float64
		if field(b, "temperature", &temp) != nil || temp == nil || *temp != 0 {
			return RefuseSeed, "a seeded sampler (seed with temperature other than 0) starts again on a resumed leg and would draw other tokens"
		}
	}
	for _, key := range []string{"presence_penalty", "frequency_penalty"} {
		var v float64
		if field(b, key, &v) == nil && v != 0 {
			return RefusePenalties, fmt.Sprintf("%s counts the generated tokens, which a resumed leg carries in its prompt", key)
		}
	}
	var words []json.RawMessage
	if field(b, "bad_words", &words) == nil && len(words) > 0 {
		return RefuseBadWords, "bad_words are matched against the generated tokens, which a resumed leg carries in its prompt"
	}
	return "", ""
}

// hasTools: a chat whose tools the engine may call (a non-empty tools
// array, tool_choice other than "none").
func hasTools(b map[string]json.RawMessage) bool {
	var tools []json.RawMessage
	if field(b, "tools", &tools) != nil || len(tools) == 0 {
		return false
	}
	var choice string
	return field(b, "tool_choice", &choice) != nil || choice != "none"
}
