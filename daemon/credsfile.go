package daemon

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"syscall"
)

// maxCredsBytes bounds a credentials file (a JWT and a seed: a few KB).
const maxCredsBytes = 1 << 20

// readMemberCreds reads connexd's own credentials file (nats_creds) and
// refuses one that anyone but connexd's user (and root) may read or
// change: whoever reads it is the member — it may publish anywhere in the
// account, answer for the member and pass protoactor's and the data
// plane's TLS as it — so an engine under its own uid must not be able to.
//
// Refused: readable or writable by others, writable by the group, owned
// by another uid than connexd's or root's (that owner could chmod it).
// Group-readable only warns: Kubernetes hands secrets to a non-root
// container as root-owned 0440 files of the pod's fsGroup, and connexd
// cannot tell who else is in the group; the warning names it. The mode is
// read from the opened file, so a swap between the check and the read
// changes nothing.
func readMemberCreds(path string, log *slog.Logger) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("nats_creds: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("nats_creds: %w", err)
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("nats_creds=%s is not a regular file", path)
	}
	perm := st.Mode().Perm()
	fix := fmt.Sprintf("chmod 600 %s, owned by connexd's user (uid %d); Kubernetes: a secret volume with defaultMode: 0400 (0440 with fsGroup)", path, os.Geteuid())
	if perm&0o007 != 0 || perm&0o020 != 0 {
		return nil, fmt.Errorf("nats_creds=%s has mode %04o: other users (engines under their own uid among them) could read or change this member's credentials and act as the member; %s", path, perm, fix)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && int(sys.Uid) != os.Geteuid() && sys.Uid != 0 {
		return nil, fmt.Errorf("nats_creds=%s is owned by uid %d, which may change its mode and read it (act as this member); %s", path, sys.Uid, fix)
	}
	if perm&0o040 != 0 {
		gid := -1
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			gid = int(sys.Gid)
		}
		log.Warn("nats_creds is readable by its group: every user in that group can act as this member; keep engines' users out of it, or chmod 600", "nats_creds", path, "mode", fmt.Sprintf("%04o", perm), "gid", gid)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxCredsBytes+1))
	if err != nil {
		return nil, fmt.Errorf("nats_creds: %w", err)
	}
	if len(b) > maxCredsBytes {
		return nil, fmt.Errorf("nats_creds=%s is larger than %d bytes: not a credentials file", path, maxCredsBytes)
	}
	return b, nil
}
