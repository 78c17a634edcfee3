package handover

import (
	"context"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// receiveTimeout bounds Receive when ctx has no earlier deadline.
const receiveTimeout = 10 * time.Second

// Receive asks the region socket at addr for engine's region with token
// (RegionInfo.handover_socket and handover_token) and returns the region's
// descriptor, which the caller maps (regionfile.AttachFile) and closes. A
// refusal wraps ErrRefused with connexd's reason; ErrBusy means try again
// (the token was not used).
func Receive(ctx context.Context, addr, engine, region, token string) (*os.File, error) {
	ctx, cancel := context.WithTimeout(ctx, receiveTimeout)
	defer cancel()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unixpacket", addr)
	if err != nil {
		return nil, fmt.Errorf("handover: connect to region socket %s: %w", addr, err)
	}
	c := nc.(*net.UnixConn)
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(dl)
	}
	if _, err := c.Write([]byte(strings.Join([]string{Proto, engine, region, token}, " "))); err != nil {
		return nil, fmt.Errorf("handover: send the request to %s: %w", addr, err)
	}
	buf := make([]byte, 4096)
	// Room for more descriptors than the one expected, so that extra ones
	// arrive (and are closed) rather than being cut off unseen.
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	fds := rights(oob[:oobn])
	closeAll := func() {
		for _, fd := range fds {
			_ = unix.Close(fd)
		}
	}
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("handover: read the answer from %s: %w", addr, err)
	}
	answer := string(buf[:n])
	if after, ok := strings.CutPrefix(answer, "ERR "); ok {
		closeAll()
		if strings.HasPrefix(after, "busy") {
			return nil, fmt.Errorf("%w: %s: %s", ErrBusy, addr, after)
		}
		return nil, fmt.Errorf("%w by connexd at %s: %s", ErrRefused, addr, after)
	}
	if answer != "OK" || len(fds) != 1 || flags&unix.MSG_CTRUNC != 0 {
		closeAll()
		return nil, fmt.Errorf("handover: unexpected answer from %s: %q with %d descriptors", addr, truncate(answer, 64), len(fds))
	}
	return os.NewFile(uintptr(fds[0]), "region:"+engine+"/"+region), nil
}

// rights returns the descriptors in the control messages oob.
func rights(oob []byte) []int {
	if len(oob) == 0 {
		return nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if f, err := unix.ParseUnixRights(&m); err == nil {
			fds = append(fds, f...)
		}
	}
	return fds
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
