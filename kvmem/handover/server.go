package handover

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Proto is the first word of a handover request.
const Proto = "CONNEX-REGION/1"

const (
	// maxMessage bounds a request: the protocol word, two ids of at most
	// 128 bytes and a 32-digit token fit with room to spare.
	maxMessage = 512
	// ioTimeout bounds a connection from accept to close, so a caller that
	// connects and says nothing holds a slot for no longer.
	ioTimeout = 5 * time.Second
	// maxConns bounds connections served at once; the next ones are
	// answered "ERR busy" and closed.
	maxConns = 64
	// busyDrain bounds the wait for a request on a connection answered
	// "ERR busy".
	busyDrain = 50 * time.Millisecond
)

// Opener opens the memory granted as ref for engine's region, as a
// descriptor to send. The server closes it after sending. An error is sent
// to the caller as the refusal's reason.
type Opener func(engine, region string, ref any) (*os.File, error)

// Options configure a Server.
type Options struct {
	// Addr is the socket: a file-system path, or "@name" in Linux's
	// abstract namespace. Empty: an abstract name made unique from the pid
	// and random bits (AutoAddr).
	Addr string
	// Open turns a granted ref into the descriptor to send.
	Open Opener
	// Log receives every handover (info) and refusal (warn), with the
	// caller's pid, uid and gid. Nil: discarded.
	Log *slog.Logger
	// Now is the clock for token expiry (nil: time.Now).
	Now func() time.Time
	// TTL and Max override TokenTTL and MaxGrants (tests); zero: those.
	TTL time.Duration
	Max int
}

// Server serves region descriptors on a unix socket to callers with a
// token (see the package doc).
type Server struct {
	o     Options
	ln    *net.UnixListener
	addr  string
	slots chan struct{}

	mu     sync.Mutex
	grants grants
	conns  map[*net.UnixConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// AutoAddr is an abstract socket name unique on this host while the process
// lives: the pid alone is not (containers in their own pid namespace share
// the host's network namespace, and with it the abstract names).
func AutoAddr() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("@connex-regions-%d-%s", os.Getpid(), hex.EncodeToString(b[:]))
}

// Listen opens the socket and starts serving. A path socket is created
// with mode 0666: the directory it is in decides who reaches it (give it
// one only engines' group may enter, if wanted), the token who gets
// memory. A stale socket file (nobody listening) is replaced; a live one
// or another kind of file is an error.
func Listen(o Options) (*Server, error) {
	if o.Open == nil {
		return nil, errors.New("handover: Options.Open is nil")
	}
	o.Addr = cmp.Or(o.Addr, AutoAddr())
	if o.Now == nil {
		o.Now = time.Now
	}
	o.TTL = cmp.Or(o.TTL, TokenTTL)
	o.Max = cmp.Or(o.Max, MaxGrants)
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	abstract := strings.HasPrefix(o.Addr, "@")
	if !abstract {
		if err := removeStale(o.Addr); err != nil {
			return nil, err
		}
	}
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: o.Addr, Net: "unixpacket"})
	if err != nil {
		return nil, fmt.Errorf("handover: listen on region socket %s: %w", o.Addr, err)
	}
	if !abstract {
		if err := os.Chmod(o.Addr, 0o666); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("handover: region socket %s: %w", o.Addr, err)
		}
	}
	s := &Server{o: o, ln: ln, addr: o.Addr, slots: make(chan struct{}, maxConns), grants: grants{max: o.Max}, conns: map[*net.UnixConn]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s, nil
}

// removeStale removes a socket file at path that nobody listens on.
func removeStale(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("handover: region socket %s: %w", path, err)
	}
	if st.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("handover: region socket %s exists and is not a socket: remove it or choose another region_socket", path)
	}
	c, err := net.DialTimeout("unixpacket", path, time.Second)
	if err == nil {
		_ = c.Close()
		return fmt.Errorf("handover: region socket %s is served by another process (another connexd?): give each connexd its own region_socket", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("handover: remove stale region socket %s: %w", path, err)
	}
	return nil
}

// Addr is the socket's address as engines dial it (RegionInfo.handover_socket).
func (s *Server) Addr() string { return s.addr }

// Grant issues a one-use token for engine's region, valid for the TTL,
// that hands over what Open makes of ref.
func (s *Server) Grant(engine, region string, ref any) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.grants.issue(engine, region, ref, s.o.Now(), s.o.TTL)
}

// Forget drops the tokens of engine's regions (the engine went away).
func (s *Server) Forget(engine string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.grants.forget(engine)
}

// Close stops serving, closes the connections being served and waits for
// them (each is bounded by ioTimeout anyway). A path socket is removed.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	err := s.ln.Close()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if err != nil {
		return fmt.Errorf("handover: close region socket %s: %w", s.addr, err)
	}
	return nil
}

func (s *Server) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.AcceptUnix()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return
			}
			// EMFILE and the like: say so, breathe, go on.
			s.o.Log.Warn("region socket: accept failed", "socket", s.addr, "err", err)
			time.Sleep(50 * time.Millisecond)
			continue
		}
		select {
		case s.slots <- struct{}{}:
		default:
			s.busy(c)
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			_ = c.Close()
			<-s.slots
			return
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			defer func() { <-s.slots }()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				_ = c.Close()
			}()
			s.serve(c)
		}()
	}
}

// busy answers a connection over the limit "ERR busy" and closes it. The
// request is read first (for at most busyDrain): closing a unix socket
// with a message still unread resets the connection, and the caller would
// read ECONNRESET instead of the answer. This runs on the accept loop, so
// a flood of connections while every slot is taken is accepted at most
// one per busyDrain; nobody else was being served then anyway.
func (s *Server) busy(c *net.UnixConn) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(busyDrain))
	buf := make([]byte, maxMessage+1)
	oob := make([]byte, unix.CmsgSpace(4*4))
	_, oobn, _, _, _ := c.ReadMsgUnix(buf, oob)
	closeRights(oob[:oobn])
	_, _ = c.Write([]byte("ERR busy: too many handovers at once, try again"))
}

// peer is the caller as the kernel saw it at connect (SO_PEERCRED).
type peer struct{ pid, uid, gid int }

func (p peer) attrs() []any { return []any{"peer_pid", p.pid, "peer_uid", p.uid, "peer_gid", p.gid} }

func peerOf(c *net.UnixConn) peer {
	p := peer{-1, -1, -1}
	rc, err := c.SyscallConn()
	if err != nil {
		return p
	}
	_ = rc.Control(func(fd uintptr) {
		if u, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			p = peer{int(u.Pid), int(u.Uid), int(u.Gid)}
		}
	})
	return p
}

// serve answers one request on c. It never panics on input and closes
// every descriptor it received or opened.
func (s *Server) serve(c *net.UnixConn) {
	_ = c.SetDeadline(time.Now().Add(ioTimeout))
	who := peerOf(c)
	engine, region, err := s.handle(c)
	if err != nil {
		s.o.Log.Warn("region socket: handover refused", append(who.attrs(), "socket", s.addr, "engine", engine, "region", region, "err", err)...)
		_, _ = c.Write([]byte("ERR " + err.Error()))
		return
	}
	s.o.Log.Info("region socket: region handed over", append(who.attrs(), "engine", engine, "region", region)...)
}

// handle reads the request, checks the token and sends the descriptor.
func (s *Server) handle(c *net.UnixConn) (engine, region string, err error) {
	buf := make([]byte, maxMessage+1)
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if n := closeRights(oob[:oobn]); n > 0 {
		return "", "", fmt.Errorf("%w: the request carried %d descriptors; send none", ErrRefused, n)
	}
	if errors.Is(err, io.EOF) || err == nil && n == 0 {
		return "", "", fmt.Errorf("%w: empty request; want %q", ErrRefused, Proto+" <engine_id> <region_id> <token>")
	}
	if err != nil {
		return "", "", fmt.Errorf("%w: read the request: %w", ErrRefused, err)
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 || n > maxMessage {
		return "", "", fmt.Errorf("%w: request longer than %d bytes", ErrRefused, maxMessage)
	}
	engine, region, token, err := parse(string(buf[:n]))
	if err != nil {
		return "", "", err
	}
	s.mu.Lock()
	ref, err := s.grants.take(engine, region, token, s.o.Now())
	s.mu.Unlock()
	if err != nil {
		return engine, region, err
	}
	f, err := s.o.Open(engine, region, ref)
	if err != nil {
		return engine, region, fmt.Errorf("%w: engine %s region %s: %w", ErrRefused, engine, region, err)
	}
	defer f.Close()
	if _, _, err := c.WriteMsgUnix([]byte("OK"), syscall.UnixRights(int(f.Fd())), nil); err != nil {
		return engine, region, fmt.Errorf("send the descriptor: %w", err)
	}
	return engine, region, nil
}

// parse splits "CONNEX-REGION/1 <engine> <region> <token>".
func parse(msg string) (engine, region, token string, err error) {
	f := strings.Split(msg, " ")
	if len(f) != 4 || f[0] != Proto {
		return "", "", "", fmt.Errorf("%w: want %q", ErrRefused, Proto+" <engine_id> <region_id> <token>")
	}
	for _, v := range f[1:] {
		if !printable(v) {
			return "", "", "", fmt.Errorf("%w: ids and token must be 1-128 printable ASCII bytes", ErrRefused)
		}
	}
	return f[1], f[2], f[3], nil
}

func printable(v string) bool {
	if v == "" || len(v) > 128 {
		return false
	}
	for i := 0; i < len(v); i++ {
		if v[i] <= ' ' || v[i] >= 0x7f {
			return false
		}
	}
	return true
}

// closeRights closes every descriptor in the control messages oob and
// returns how many there were.
func closeRights(oob []byte) int {
	fds := rights(oob)
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
	return len(fds)
}
