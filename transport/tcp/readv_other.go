//go:build !(darwin || linux || openbsd)

package tcp

import "errors"

// readvSupported: no readv(2) here; recvBuf reads as bufio does.
const readvSupported = false

func readv(int, [][]byte) (int, error) { return 0, errors.ErrUnsupported }
