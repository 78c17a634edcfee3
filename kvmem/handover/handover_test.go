package handover

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
)

// fakeClock is a settable clock for token expiry.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// regionFile is a file whose content names the ref it was opened for.
func regionFile(t *testing.T, content string) *os.File {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "region")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	return f
}

// startServer serves refs (strings) as files holding the ref.
func startServer(t *testing.T, addr string) (*Server, *fakeClock, *atomic.Int32) {
	t.Helper()
	clk := &fakeClock{t: time.Unix(1000, 0)}
	opened := new(atomic.Int32)
	s, err := Listen(Options{Addr: addr, Now: clk.now, Open: func(engine, region string, ref any) (*os.File, error) {
		opened.Add(1)
		if ref == "gone" {
			return nil, errors.New("the region went away")
		}
		f := regionFile(t, ref.(string))
		_, err := f.Seek(0, io.SeekStart)
		return f, err
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s, clk, opened
}

func receiveContent(t *testing.T, s *Server, engine, region, token string) (string, error) {
	t.Helper()
	f, err := Receive(context.Background(), s.Addr(), engine, region, token)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b), nil
}

func wantRefused(t *testing.T, what string, err error, says string) {
	t.Helper()
	if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), says) {
		t.Fatalf("%s: %v; want ErrRefused saying %q", what, err, says)
	}
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// noLeakedFDs checks, polling until the server's goroutines closed their
// ends, that the process has as many descriptors as before.
func noLeakedFDs(t *testing.T, before int) {
	t.Helper()
	poll.Until(t, 5*time.Second, 10*time.Millisecond, func() error {
		if n := openFDs(t); n != before {
			return fmt.Errorf("descriptors: %d open, %d before", n, before)
		}
		return nil
	})
}

func TestHandover(t *testing.T) {
	s, clk, opened := startServer(t, "")
	before := openFDs(t)

	tokA, err := s.Grant("engA", "r0", "memory of A")
	if err != nil {
		t.Fatal(err)
	}
	tokB, err := s.Grant("engB", "r0", "memory of B")
	if err != nil {
		t.Fatal(err)
	}

	_, err = receiveContent(t, s, "engA", "r0", strings.Repeat("0", 32))
	wantRefused(t, "wrong token", err, "no valid token for engine engA region r0")
	_, err = receiveContent(t, s, "engB", "r0", tokA)
	wantRefused(t, "engine A's token presented for engine B's region (not its owner)", err, "no valid token")
	_, err = receiveContent(t, s, "engA", "r1", tokA)
	wantRefused(t, "engine A's token for another region of A", err, "no valid token")

	got, err := receiveContent(t, s, "engA", "r0", tokA)
	if err != nil || got != "memory of A" {
		t.Fatalf("engine A with its token: %q %v; want its region (a refused try must not burn it)", got, err)
	}
	_, err = receiveContent(t, s, "engA", "r0", tokA)
	wantRefused(t, "engine A's token a second time", err, "no valid token")

	clk.advance(TokenTTL)
	_, err = receiveContent(t, s, "engB", "r0", tokB)
	wantRefused(t, "engine B's token after its TTL", err, "no valid token")

	tokC, _ := s.Grant("engC", "r0", "memory of C")
	s.Forget("engC")
	_, err = receiveContent(t, s, "engC", "r0", tokC)
	wantRefused(t, "a token of a forgotten engine", err, "no valid token")

	tokG, _ := s.Grant("engG", "r0", "gone")
	_, err = receiveContent(t, s, "engG", "r0", tokG)
	wantRefused(t, "a region whose memory cannot be opened", err, "the region went away")

	if n := opened.Load(); n != 2 {
		t.Fatalf("Open called %d times; want 2 (only for valid tokens)", n)
	}
	noLeakedFDs(t, before)
}

// TestHandoverBadInput sends what a stranger might: garbage, a request too
// long, a request with descriptors attached, nothing at all. Each gets a
// clear refusal, the server goes on serving, and no descriptor leaks.
func TestHandoverBadInput(t *testing.T) {
	s, _, opened := startServer(t, filepath.Join(t.TempDir(), "region.sock"))
	tok, _ := s.Grant("eng", "r0", "memory")
	before := openFDs(t)

	raw := func(msg []byte, oob []byte) string {
		t.Helper()
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.Addr(), Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		if msg != nil {
			if _, _, err := c.WriteMsgUnix(msg, oob, nil); err != nil {
				t.Fatal(err)
			}
		}
		buf := make([]byte, 4096)
		rb := make([]byte, 64)
		n, oobn, _, _, err := c.ReadMsgUnix(buf, rb)
		if oobn != 0 {
			t.Errorf("a refusal carried control data (%d bytes)", oobn)
		}
		if err != nil && n == 0 {
			return "read: " + err.Error()
		}
		return string(buf[:n])
	}
	for _, tc := range []struct {
		what string
		msg  string
		says string
	}{
		{"garbage", "GET / HTTP/1.1", "want \"CONNEX-REGION/1"},
		{"wrong protocol", "CONNEX-REGION/2 eng r0 " + tok, "want"},
		{"missing token", "CONNEX-REGION/1 eng r0", "want"},
		{"two spaces", "CONNEX-REGION/1 eng  r0 " + tok, "want"},
		{"control characters", "CONNEX-REGION/1 eng\x00 r0 " + tok, "printable"},
		{"too long", "CONNEX-REGION/1 eng r0 " + strings.Repeat("a", 600), "longer than 512"},
		{"empty", "", "want"},
	} {
		if got := raw([]byte(tc.msg), nil); !strings.HasPrefix(got, "ERR ") || !strings.Contains(got, tc.says) {
			t.Errorf("%s: answer %q; want ERR saying %q", tc.what, got, tc.says)
		}
	}
	// A request carrying descriptors: refused, and the server closes them.
	f := regionFile(t, "x")
	fds := syscall.UnixRights(int(f.Fd()), int(f.Fd()))
	if got := raw([]byte("CONNEX-REGION/1 eng r0 "+tok), fds); !strings.Contains(got, "carried 2 descriptors") {
		t.Errorf("request with descriptors: answer %q", got)
	}
	f.Close()
	// Silence until the deadline: the connection is closed, nothing sent.
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.Addr(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()

	if n := opened.Load(); n != 0 {
		t.Fatalf("Open called %d times for bad requests", n)
	}
	// The token survived all of it: the engine still gets its region.
	got, err := receiveContent(t, s, "eng", "r0", tok)
	if err != nil || got != "memory" {
		t.Fatalf("after bad input: %q %v", got, err)
	}
	noLeakedFDs(t, before)
}

// TestHandoverSocketFile: a stale socket file is replaced, a live one is
// not taken over, another file is left alone, and Close removes the socket.
func TestHandoverSocketFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "region.sock")
	open := func(string, string, any) (*os.File, error) { return nil, errors.New("unused") }

	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(Options{Addr: path, Open: open}); err == nil || !strings.Contains(err.Error(), "served by another process") {
		t.Fatalf("live socket: %v", err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close() // stale now
	s, err := Listen(Options{Addr: path, Open: open})
	if err != nil {
		t.Fatalf("stale socket: %v", err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o666 {
		t.Fatalf("socket mode: %v %v", st, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("socket left after Close: %v", err)
	}
	if err := os.WriteFile(path, []byte("not a socket"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(Options{Addr: path, Open: open}); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("regular file: %v", err)
	}
}

func TestGrantsBounded(t *testing.T) {
	g := grants{max: 3}
	now := time.Unix(0, 0)
	var toks []string
	for i := range 5 {
		tok, err := g.issue("e", "r", i, now, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		toks = append(toks, tok)
	}
	if len(g.list) != 3 {
		t.Fatalf("%d grants kept; want 3", len(g.list))
	}
	if _, err := g.take("e", "r", toks[0], now); !errors.Is(err, ErrRefused) {
		t.Fatalf("the oldest token past the bound: %v", err)
	}
	if ref, err := g.take("e", "r", toks[4], now); err != nil || ref != 4 {
		t.Fatalf("the newest token: %v %v", ref, err)
	}
}

// TestHandoverBusy: a local user holding every slot gets the next caller
// ErrBusy, not a hang; the token survives and works once slots free up.
func TestHandoverBusy(t *testing.T) {
	s, _, _ := startServer(t, "")
	tok, _ := s.Grant("eng", "r0", "memory")
	var hogs []*net.UnixConn
	for range maxConns {
		c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.Addr(), Net: "unixpacket"})
		if err != nil {
			t.Fatal(err)
		}
		hogs = append(hogs, c)
	}
	// The hogs are accepted one by one: wait until every slot is taken.
	poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		if n := len(s.slots); n != maxConns {
			return fmt.Errorf("%d of %d slots taken", n, maxConns)
		}
		return nil
	})
	_, err := receiveContent(t, s, "eng", "r0", tok)
	if !errors.Is(err, ErrBusy) || errors.Is(err, ErrRefused) {
		t.Fatalf("with every slot taken: %v; want ErrBusy", err)
	}
	for _, c := range hogs {
		c.Close()
	}
	poll.Until(t, 5*time.Second, 5*time.Millisecond, func() error {
		got, err := receiveContent(t, s, "eng", "r0", tok)
		if err != nil {
			return err
		}
		if got != "memory" {
			t.Fatalf("got %q", got)
		}
		return nil
	})
}

// TestGrantsOneEngineForgetsOnlyItsOwn: an engine calling region.create in a
// loop forgets its own oldest tokens, never a neighbour's, whether its own
// bound or the table's is reached first.
func TestGrantsOneEngineForgetsOnlyItsOwn(t *testing.T) {
	for _, c := range []struct {
		name           string
		max, perEngine int
	}{{"engine bound", 100, 4}, {"table bound", 6, 100}} {
		t.Run(c.name, func(t *testing.T) {
			g := grants{max: c.max, perEngine: c.perEngine}
			now := time.Unix(0, 0)
			quiet, err := g.issue("quiet", "r", "quiet's", now, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			var last string
			for i := range 200 {
				if last, err = g.issue("loud", "r", i, now, time.Minute); err != nil {
					t.Fatal(err)
				}
			}
			if n := g.count("loud"); n > c.perEngine || n > c.max-1 {
				t.Fatalf("loud holds %d tokens; want at most min(%d, %d)", n, c.perEngine, c.max-1)
			}
			if ref, err := g.take("quiet", "r", quiet, now); err != nil || ref != "quiet's" {
				t.Fatalf("the quiet engine's token after its neighbour's loop: %v %v", ref, err)
			}
			if ref, err := g.take("loud", "r", last, now); err != nil || ref != 199 {
				t.Fatalf("the loud engine's newest token: %v %v", ref, err)
			}
		})
	}
}
