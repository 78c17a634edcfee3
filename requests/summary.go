package requests

import (
	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

// Summary is st without its token lists — prompt_token_ids,
// generated_token_ids and params.remote_block_ids — with prompt_len and
// generated_len standing for them: what request.progress and
// request.finish answer. An engine checkpoints many times a request, and
// an answer that carried the whole state grew with the prompt and with
// every token generated (thousands of ids, decoded on the engine's side
// each time); request.inspect answers the whole state. st is not changed.
func Summary(st *messages.RequestState) *messages.RequestState {
	if st == nil {
		return nil
	}
	out := &messages.RequestState{
		RequestId: st.RequestId, Owner: st.Owner, Epoch: st.Epoch, EngineId: st.EngineId,
		UpdatedUnixMs: st.UpdatedUnixMs, PreviousOwners: st.PreviousOwners, ResumeAuthority: st.ResumeAuthority,
		PromptLen: uint32(PromptLen(st)), PromptDigest: st.PromptDigest, PromptKey: st.PromptKey,
		PromptStoredUnixMs: st.PromptStoredUnixMs, MaxTokens: st.MaxTokens,
		GeneratedLen: uint32(len(st.GeneratedTokenIds)),
	}
	if st.Params != nil {
		out.Params = proto.CloneOf(st.Params)
		out.Params.RemoteBlockIds = nil
	}
	return out
}
