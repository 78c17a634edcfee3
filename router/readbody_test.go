package router

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestReadBody: whatever length the answer announced — right, short, long,
// absent or absurd — readBody returns exactly the bytes io.ReadAll does,
// and the reader's error.
func TestReadBody(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789abcdef"), 700) // 11200 bytes
	for _, length := range []int64{-1, 0, 1, 100, int64(len(body)) - 1, int64(len(body)), int64(len(body)) + 1, 1 << 40} {
		for name, r := range map[string]func() io.Reader{
			"whole":   func() io.Reader { return bytes.NewReader(body) },
			"onebyte": func() io.Reader { return iotest.OneByteReader(bytes.NewReader(body)) },
			"dataerr": func() io.Reader { return iotest.DataErrReader(bytes.NewReader(body)) },
		} {
			got, err := readBody(r(), length, 1<<20)
			if err != nil || !bytes.Equal(got, body) {
				t.Fatalf("length %d, %s: got %d bytes, err %v; want %d bytes", length, name, len(got), err, len(body))
			}
		}
	}
	boom := errors.New("boom")
	if _, err := readBody(iotest.ErrReader(boom), 10, 1<<20); !errors.Is(err, boom) {
		t.Fatalf("a failing reader: err %v, want %v", err, boom)
	}
	if _, err := readBody(io.MultiReader(bytes.NewReader(body[:5]), iotest.ErrReader(boom)), int64(len(body)), 1<<20); !errors.Is(err, boom) {
		t.Fatalf("a reader failing midway: err %v, want %v", err, boom)
	}
}

// TestReadBodyDoesNotTrustContentLength: a client that announces 8 MiB and
// sends one byte gets no 8 MiB buffer set aside for it.
func TestReadBodyDoesNotTrustContentLength(t *testing.T) {
	b, err := readBody(strings.NewReader("{"), 8<<20, 8<<20)
	if err != nil || string(b) != "{" {
		t.Fatalf("readBody = %q, %v", b, err)
	}
	if cap(b) > maxPresize+1 {
		t.Fatalf("a 1-byte body announced as 8 MiB got a %d-byte buffer", cap(b))
	}
	// A body as long as it said, past maxPresize, is still read whole.
	long := strings.Repeat("x", 3*maxPresize)
	if b, err := readBody(strings.NewReader(long), int64(len(long)), 8<<20); err != nil || string(b) != long {
		t.Fatalf("a %d-byte body read back as %d bytes, %v", len(long), len(b), err)
	}
}
