package router

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"sync"
)

// maxEventBytes bounds one server-sent event from an engine.
const maxEventBytes = 4 << 20

// sseReader reads "data:" events from an engine's stream.
type sseReader struct {
	r    *bufio.Reader // nil once the stream ended (back in readers)
	buf  []byte        // the event being read; reused from one event to the next
	long []byte        // a line longer than r's buffer, gathered (line)
	end  error         // how the stream ended
}

// readers keeps the 64 KiB line buffers of ended streams for the next leg:
// one per leg would be most of what a request allocates.
var readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}

func newSSEReader(r io.Reader) *sseReader {
	br := readers.Get().(*bufio.Reader)
	br.Reset(r)
	return &sseReader{r: br}
}

// errDone is returned after "data: [DONE]".
var errDone = fmt.Errorf("router: stream done")

// next returns the next event's data, valid until the next call; errDone
// after [DONE]; io.EOF or io.ErrUnexpectedEOF if the stream ended without
// [DONE]. Once it returned an error it returns that error again.
func (s *sseReader) next() ([]byte, error) {
	if s.r == nil {
		return nil, s.end
	}
	data, err := s.event()
	if err != nil {
		s.r.Reset(nil)
		readers.Put(s.r)
		s.r, s.end = nil, err
	}
	return data, err
}

// ready reports whether the whole next event has arrived already: a data
// line and the blank line after it, so that next will not wait for the
// engine.
func (s *sseReader) ready() bool {
	if s.r == nil {
		return false
	}
	b, _ := s.r.Peek(s.r.Buffered())
	data := false
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return false
		}
		line := bytes.TrimRight(b[:i], "\r")
		switch {
		case len(line) == 0 && data:
			return true
		case bytes.HasPrefix(line, []byte("data:")):
			// as event reads it: an empty data line adds nothing
			data = data || len(bytes.TrimPrefix(bytes.TrimPrefix(line, []byte("data:")), []byte(" "))) > 0
		}
		b = b[i+1:]
	}
}

// line reads the next line, its end included, valid until the next call.
// A line longer than the reader's 64 KiB buffer (the first chunk of a
// long prompt's answer carries its token ids: ~6 bytes each) is gathered
// into s.long, up to maxEventBytes.
func (s *sseReader) line() ([]byte, error) {
	line, err := s.r.ReadSlice('\n')
	if err != bufio.ErrBufferFull {
		return line, err
	}
	s.long = append(s.long[:0], line...)
	for {
		line, err = s.r.ReadSlice('\n')
		if len(s.long)+len(line) > maxEventBytes+len("data: \r\n") {
			return nil, fmt.Errorf("router: engine event line longer than %d bytes", maxEventBytes)
		}
		s.long = append(s.long, line...)
		if err != bufio.ErrBufferFull {
			return s.long, err
		}
	}
}

func (s *sseReader) event() ([]byte, error) {
	data := s.buf[:0]
	for {
		line, err := s.line()
		if err != nil {
			if err == io.EOF {
				return nil, io.ErrUnexpectedEOF
			}
			return nil, err
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0:
			if len(data) == 0 {
				continue
			}
			s.buf = data
			if string(bytes.TrimSpace(data)) == "[DONE]" {
				return nil, errDone
			}
			return data, nil
		case bytes.HasPrefix(line, []byte("data:")):
			d := bytes.TrimPrefix(bytes.TrimPrefix(line, []byte("data:")), []byte(" "))
			if len(data)+len(d) > maxEventBytes {
				return nil, fmt.Errorf("router: engine event larger than %d bytes", maxEventBytes)
			}
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, d...)
		default:
			// comments (":"), event:, id:, retry: carry nothing we use
		}
	}
}
