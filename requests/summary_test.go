package requests

import (
	"testing"

	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

// TestSummaryKeepsEveryFieldButTheTokenLists: the summary of a state with
// every field set has every field but the prompt's token ids, the
// generated ids and the hold's block ids, and counts them; the state is
// left as it was. A field added to RequestState and not copied fails it.
func TestSummaryKeepsEveryFieldButTheTokenLists(t *testing.T) {
	st := &messages.RequestState{}
	fill(st.ProtoReflect())
	st.PromptTokenIds = []uint32{1, 2, 3}
	st.GeneratedTokenIds = []uint32{4, 5}
	st.PromptLen = 3
	before := proto.Clone(st)
	sum := Summary(st)
	if !proto.Equal(st, before) {
		t.Fatal("Summary changed the state it summed up")
	}
	if len(sum.PromptTokenIds) != 0 || len(sum.GeneratedTokenIds) != 0 || len(sum.GetParams().GetRemoteBlockIds()) != 0 {
		t.Fatalf("the summary carries token lists: %v", sum)
	}
	if sum.PromptLen != 3 || sum.GeneratedLen != 2 {
		t.Fatalf("prompt_len=%d generated_len=%d, want 3 and 2", sum.PromptLen, sum.GeneratedLen)
	}
	// Put the lists back: every other field must be the state's.
	back := proto.Clone(sum).(*messages.RequestState)
	back.PromptTokenIds, back.GeneratedTokenIds = st.PromptTokenIds, st.GeneratedTokenIds
	back.Params.RemoteBlockIds = st.Params.RemoteBlockIds
	want := proto.Clone(st).(*messages.RequestState)
	want.GeneratedLen = 2
	if !proto.Equal(back, want) {
		t.Fatalf("the summary lost a field:\n%v\nwant\n%v", back, want)
	}
	if Summary(nil) != nil {
		t.Fatal("the summary of no state is not nil")
	}
}
