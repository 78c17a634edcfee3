package tcp

import (
	"errors"
	"fmt"
	"io"
	"syscall"
)

// errConnAborted fails the requests of a connection that this side closed
// to unblock a canceled Get. Those requests did nothing wrong, so their Gets
// resend them on a fresh connection.
var errConnAborted = errors.New("tcp: connection closed to abandon a canceled get")

// errConnLost marks a connection that failed under the requests (EOF,
// reset, write error) as opposed to one that delivered garbage. Requests
// lost with it are resent once more on a fresh connection, as HTTP clients
// do for idempotent requests: the holder may have closed an idle connection
// just as the Get reused it. A dead holder refuses the redial, so the Get
// still fails with ErrPeerGone.
var errConnLost = errors.New("connection lost")

// errGatherRefused completes a GATHER that was planned while the holder
// spoke protocol version 2 and was to be sent on a connection that offered
// 1 (the holder refused 2 since): the Get sends its parts again as GETs.
var errGatherRefused = fmt.Errorf("tcp: a GATHER on a connection of protocol version %d", minProtocolVersion)

// maxTries bounds how often one chunk is resent after errConnAborted.
const maxTries = 5

func isEOF(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

func isReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.ECONNABORTED)
}
