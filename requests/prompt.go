package requests

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

// PromptDigest is the SHA-256 of a request's prompt token ids and its hold's
// block ids (the RequestPrompt), each as 4 little-endian bytes, with the
// count of tokens first so that no split of one list moves into the other.
func PromptDigest(tokens, blocks []uint32) []byte {
	h := sha256.New()
	b := binary.LittleEndian.AppendUint32(make([]byte, 0, 4*(1+len(tokens)+len(blocks))), uint32(len(tokens)))
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	for _, t := range blocks {
		b = binary.LittleEndian.AppendUint32(b, t)
	}
	h.Write(b)
	return h.Sum(nil)
}

// PromptKey is the KV key of request id's RequestPrompt with digest: the
// key names the content, so that two writers of the same prompt (a
// creation race, a takeover retried) write the same entry, and writers of
// different ones never overwrite each other's.
func PromptKey(id string, digest []byte) string {
	return "p." + id + "." + hex.EncodeToString(digest[:16])
}

// PromptLen is the number of prompt tokens of st, whether or not its token
// ids were read.
func PromptLen(st *messages.RequestState) int {
	if n := len(st.GetPromptTokenIds()); n > 0 {
		return n
	}
	return int(st.GetPromptLen())
}

// withPrompt sets st's prompt: its token ids, count, digest and key.
func withPrompt(st *messages.RequestState, tokens []uint32) {
	st.PromptTokenIds = tokens
	st.PromptLen = uint32(len(tokens))
	st.PromptDigest = PromptDigest(tokens, st.GetParams().GetRemoteBlockIds())
	st.PromptKey = PromptKey(st.RequestId, st.PromptDigest)
}

// digestOf is the digest of st's prompt: the stored one, or for a record
// written before the split (the prompt in it), computed.
func digestOf(st *messages.RequestState) []byte {
	if st.PromptKey != "" {
		return st.PromptDigest
	}
	return PromptDigest(st.PromptTokenIds, st.GetParams().GetRemoteBlockIds())
}

// extendsPrompt reports whether tokens start with st's prompt and blocks
// are its hold's blocks: a takeover that resends the prompt followed by
// the tokens generated so far.
func extendsPrompt(st *messages.RequestState, tokens, blocks []uint32) bool {
	n := PromptLen(st)
	return n > 0 && len(tokens) >= n && bytes.Equal(PromptDigest(tokens[:n], blocks), digestOf(st))
}

// SplitState is st in the two parts the store keeps: the record (every
// field but the prompt's token ids and params.remote_block_ids, and
// generated_len, which only a summary carries) and the RequestPrompt
// (those two). st is not changed.
func SplitState(st *messages.RequestState) (record *messages.RequestState, prompt *messages.RequestPrompt) {
	prompt = &messages.RequestPrompt{TokenIds: st.PromptTokenIds, RemoteBlockIds: st.GetParams().GetRemoteBlockIds()}
	record = &messages.RequestState{
		RequestId: st.RequestId, GeneratedTokenIds: st.GeneratedTokenIds, Owner: st.Owner, Epoch: st.Epoch,
		EngineId: st.EngineId, UpdatedUnixMs: st.UpdatedUnixMs, PreviousOwners: st.PreviousOwners,
		ResumeAuthority: st.ResumeAuthority, PromptLen: st.PromptLen, PromptDigest: st.PromptDigest, PromptKey: st.PromptKey,
		PromptStoredUnixMs: st.PromptStoredUnixMs, MaxTokens: st.MaxTokens,
		// GeneratedLen is left out: it counts the ids of a summary
		// (requests.Summary), and a record holds the ids themselves.
	}
	if st.Params != nil {
		record.Params = proto.CloneOf(st.Params)
		record.Params.RemoteBlockIds = nil
	}
	return record, prompt
}

// JoinState puts a record and its prompt back together (a record read
// without it stays as it is, its token and block ids empty).
func JoinState(record *messages.RequestState, prompt *messages.RequestPrompt) *messages.RequestState {
	if prompt == nil {
		return record
	}
	record.PromptTokenIds = prompt.TokenIds
	if record.Params == nil {
		record.Params = &messages.KVTransferParams{}
	}
	record.Params.RemoteBlockIds = prompt.RemoteBlockIds
	return record
}
