package router

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
)

// maxEventBytes bounds one server-sent event from an engine.
const maxEventBytes = 4 << 20

// engineChunk is what the router reads from one engine chunk (completions
// or chat, vLLM's shape with return_token_ids).
type engineChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content *string `json:"content"`
		} `json:"delta"`
		TokenIDs       []uint32 `json:"token_ids"`
		FinishReason   *string  `json:"finish_reason"`
		PromptTokenIDs []uint32 `json:"prompt_token_ids"`
	} `json:"choices"`
	PromptTokenIDs []uint32        `json:"prompt_token_ids"`
	Usage          json.RawMessage `json:"usage"`
	Connex         json.RawMessage `json:"connex"`
	Error          json.RawMessage `json:"error"`
}

// text is the chunk's new text, whatever the endpoint.
func (c *engineChunk) text() string {
	if len(c.Choices) == 0 {
		return ""
	}
	if c.Choices[0].Delta.Content != nil {
		return *c.Choices[0].Delta.Content
	}
	return c.Choices[0].Text
}

// sseReader reads "data:" events from an engine's stream.
type sseReader struct {
	r *bufio.Reader
}

func newSSEReader(r io.Reader) *sseReader { return &sseReader{r: bufio.NewReaderSize(r, 64<<10)} }

// errDone is returned after "data: [DONE]".
var errDone = fmt.Errorf("router: stream done")

// next returns the next event's data; errDone after [DONE]; io.EOF or
// io.ErrUnexpectedEOF if the stream ended without [DONE].
func (s *sseReader) next() ([]byte, error) {
	var data []byte
	for {
		line, err := s.r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			return nil, fmt.Errorf("router: engine event line longer than %d bytes", s.r.Size())
		}
		if err != nil {
			if err == io.EOF {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			if data == nil {
				continue
			}
			if string(bytes.TrimSpace(data)) == "[DONE]" {
				return nil, errDone
			}
			return data, nil
		case bytes.HasPrefix(line, []byte("data:")):
			d := bytes.TrimPrefix(bytes.TrimPrefix(line, []byte("data:")), []byte(" "))
			if len(data)+len(d) > maxEventBytes {
				return nil, fmt.Errorf("router: engine event larger than %d bytes", maxEventBytes)
			}
			if data != nil {
				data = append(data, '\n')
			}
			data = append(data, d...)
		default:
			// comments (":"), event:, id:, retry: carry nothing we use
		}
	}
}
