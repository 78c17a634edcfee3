package router

import (
	"encoding/json"
	"net/http/httptest"
	"testing"
)

// wantTokenEvent is the event encoding/json writes for the same chunk.
func wantTokenEvent(t testing.TB, e *emitter, text string, ids []uint32, finish *string) string {
	ch := outChoice{FinishReason: finish}
	if e.c.Kind == Chat {
		ch.Delta = &outMessage{Content: text}
	} else {
		ch.Text = &text
	}
	if e.c.ReturnTokenIDs {
		ch.TokenIDs = &ids
	}
	b, err := json.Marshal(e.envelope(true, ch))
	if err != nil {
		t.Fatal(err)
	}
	return "data: " + string(b) + "\n\n"
}

func checkTokenEvent(t testing.TB, kind Kind, ret bool, model, text string, ids []uint32, finish *string) {
	e := newEmitter(httptest.NewRecorder(), &ClientRequest{Kind: kind, Model: model, Stream: true, ReturnTokenIDs: ret}, "cmpl-<&>\u2028", 1700000000)
	want := wantTokenEvent(t, e, text, ids, finish)
	for range 2 { // the second event reuses the head
		if got := string(e.tokenEvent(nil, text, ids, finish)); got != want {
			t.Fatalf("kind %v ids %v text %q finish %v:\n got %s\nwant %s", kind, ret, text, finish, got, want)
		}
	}
}

// TestTokenEventIsEncodingJSONs: the hand-built token event is byte for byte
// what encoding/json writes for outChunk, whatever the text holds.
func TestTokenEventIsEncodingJSONs(t *testing.T) {
	length := "length"
	odd := "st\"op<"
	texts := []string{"", " hello", "a\"b\\c", "<script>&", "tab\tnl\ncr\r\b\f\x01\x1f", "héllo 世界 🙂", "\u2028\u2029", "bad \xff\xfe utf8", "\x7f"}
	for _, kind := range []Kind{Completions, Chat} {
		for _, ret := range []bool{false, true} {
			for _, text := range texts {
				for _, ids := range [][]uint32{nil, {}, {7}, {0, 1, 4294967295}} {
					for _, fin := range []*string{nil, &length, &odd} {
						checkTokenEvent(t, kind, ret, "m\"<odel>", text, ids, fin)
					}
				}
			}
		}
	}
}

func FuzzTokenEvent(f *testing.F) {
	f.Add("hello", "m", uint32(3), true, true)
	f.Add("\xff<\u2028", "\x00", uint32(0), false, false)
	f.Fuzz(func(t *testing.T, text, model string, id uint32, chat, ret bool) {
		kind := Completions
		if chat {
			kind = Chat
		}
		fin := text
		checkTokenEvent(t, kind, ret, model, text, []uint32{id, id + 1}, &fin)
	})
}
