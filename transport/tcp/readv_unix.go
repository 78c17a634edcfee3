//go:build darwin || linux || openbsd

package tcp

import "golang.org/x/sys/unix"

// readvSupported: this platform has readv(2) (recvBuf).
const readvSupported = true

func readv(fd int, iov [][]byte) (int, error) { return unix.Readv(fd, iov) }
