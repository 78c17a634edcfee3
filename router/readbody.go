package router

import (
	"errors"
	"io"
)

// maxPrefillAnswer bounds what the router reads of a prefill engine's
// answer (its prompt's token ids included).
const maxPrefillAnswer = 64 << 20

// maxPresize bounds the buffer readBody sets aside before any byte of a
// body arrived: a Content-Length is only a claim, and a client that
// announces megabytes and sends one byte must not hold megabytes for the
// read timeout (256 such clients at the default router_max_body_bytes
// would hold 2 GiB).
const maxPresize = 64 << 10

// readBody reads r to its end, as io.ReadAll, into one buffer sized for
// length (the announced Content-Length; -1, or anything above limit, when
// unknown or not to be trusted) up to maxPresize, so a body whose length
// was said costs one allocation instead of a doubling series of them. A
// body longer than it said is still read whole, to whatever limit r
// enforces.
func readBody(r io.Reader, length, limit int64) ([]byte, error) {
	if length < 0 || length > limit {
		return io.ReadAll(r)
	}
	// One byte more than announced, so that EOF is seen without a regrow.
	buf := make([]byte, 0, min(length, maxPresize)+1)
	for {
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if errors.Is(err, io.EOF) {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
		if len(buf) == cap(buf) {
			rest, err := io.ReadAll(r)
			return append(buf, rest...), err
		}
	}
}
