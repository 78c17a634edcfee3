package requests

import "github.com/connex/connex/messages"

// Summary is st without its token lists — prompt_token_ids,
// generated_token_ids and params.remote_block_ids — with prompt_len and
// generated_len standing for them: what request.progress and
// request.finish answer. An engine checkpoints many times a request, and
// an answer that carried the whole state grew with the prompt and with
// every token generated (thousands of ids, decoded on the engine's side
// each time); request.inspect answers the whole state. It is the record
// SplitState stores, less its generated ids. st is not changed.
func Summary(st *messages.RequestState) *messages.RequestState {
	if st == nil {
		return nil
	}
	out, _ := SplitState(st)
	out.PromptLen = uint32(PromptLen(st))
	out.GeneratedTokenIds, out.GeneratedLen = nil, uint32(len(st.GeneratedTokenIds))
	return out
}
