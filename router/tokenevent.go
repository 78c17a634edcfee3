package router

import (
	"encoding/json"
	"strconv"
)

// A streamed answer is mostly token events, one per engine chunk. They are
// written by appending to a buffer the emitter keeps: the part every event
// of a request shares (id, object, created, model) is encoded once, and
// each event adds its text, finish reason and token ids, in the order and
// with the escaping encoding/json gives outChunk, without reflection.

// tokenEvent appends the SSE event of one streamed chunk to b.
func (e *emitter) tokenEvent(b []byte, text string, ids []uint32, finish *string) []byte {
	return e.event(b, text, ids, finish, nil)
}

// event appends the SSE event of one streamed chunk to b, with the extras
// of the engine choice x (nil: none, the common chunk). Its extras are
// compact JSON already (extraJSON), in the form encoding/json gives them.
func (e *emitter) event(b []byte, text string, ids []uint32, finish *string, x *engineChoice) []byte {
	if e.head == nil {
		h, _ := json.Marshal(e.envelope(true))
		// h ends with "choices":[]}: the choices go inside.
		e.head = append([]byte("data: "), h[:len(h)-2]...)
	}
	b = append(b, e.head...)
	switch {
	case e.c.Kind == Chat && x == nil:
		b = append(b, `{"index":0,"delta":{"content":`...)
		b = appendJSONString(b, text)
		b = append(b, '}')
	case e.c.Kind == Chat:
		b = append(b, `{"index":0,"delta":{`...)
		b = appendDelta(b, text, x)
		b = append(b, '}')
	default:
		b = append(b, `{"index":0,"text":`...)
		b = appendJSONString(b, text)
	}
	if x == nil || x.Logprobs == "" {
		b = append(b, `,"logprobs":null,"finish_reason":`...)
	} else {
		b = append(b, `,"logprobs":`...)
		b = append(b, x.Logprobs...)
		b = append(b, `,"finish_reason":`...)
	}
	if finish == nil {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, *finish)
	}
	if e.c.ReturnTokenIDs {
		b = append(b, `,"token_ids":`...)
		if ids == nil {
			b = append(b, "null"...)
		} else {
			b = append(b, '[')
			for i, id := range ids {
				if i > 0 {
					b = append(b, ',')
				}
				b = strconv.AppendUint(b, uint64(id), 10)
			}
			b = append(b, ']')
		}
	}
	return append(b, "}]}\n\n"...)
}

// appendJSONString appends s as encoding/json encodes a string: as it is
// when it holds only printable ASCII that needs no escape (most tokens),
// else through encoding/json itself.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return append(b, mustJSON(s)...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
