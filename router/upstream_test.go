package router

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
)

func testUpstream() *upstream {
	d := &net.Dialer{Timeout: 2 * time.Second}
	return newUpstream(&http.Client{Transport: &http.Transport{DisableCompression: true}}, d.DialContext)
}

// countingServer is an httptest server that counts the connections it accepted.
func countingServer(t *testing.T, h http.Handler) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var conns atomic.Int64
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, &conns
}

// engineLike answers as engines do, by path.
func engineLike() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/stream", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 5 {
			fmt.Fprintf(w, "data: {\"i\":%d,\"echo\":%q}\n\n", i, body)
			w.(http.Flusher).Flush()
		}
		io.WriteString(w, "data: [DONE]\n\n")
	})
	mux.HandleFunc("/length", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Length", fmt.Sprint(len(body)+2))
		w.Write(append(append([]byte("<"), body...), '>'))
	})
	mux.HandleFunc("/empty", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("/early", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "</x>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		w.Header().Del("Link")
		io.WriteString(w, "after hints")
	})
	mux.HandleFunc("/error", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":{"message":"no"}}`, http.StatusServiceUnavailable)
	})
	mux.HandleFunc("/close", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		io.WriteString(w, "bye")
	})
	mux.HandleFunc("/large", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, strings.Repeat("x", 300<<10))
	})
	return mux
}

// fetch posts body to url (GET if body is nil) and reads the whole answer.
func fetch(t *testing.T, u *upstream, url string, body []byte) (int, string) {
	t.Helper()
	var resp *upResponse
	var err error
	if body == nil {
		resp, err = u.get(context.Background(), url)
	} else {
		resp, err = u.post(context.Background(), url, body, "")
	}
	st, b, err := readAnswer(resp, err)
	if err != nil {
		t.Fatalf("%s: %v", url, err)
	}
	return st, b
}

func netHTTPDo(t *testing.T, method, url string, body []byte) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		rd = strings.NewReader(string(body))
	}
	req, _ := http.NewRequest(method, url, rd)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("net/http %s: %v", url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("net/http %s: body: %v", url, err)
	}
	return resp.StatusCode, data
}

// TestUpstreamAsNetHTTP: the legs' client reads what net/http reads from
// the same server (chunked, Content-Length, none, 1xx, errors, close), and
// keeps one connection for a run of requests that each end cleanly.
func TestUpstreamAsNetHTTP(t *testing.T) {
	srv, conns := countingServer(t, engineLike())
	u := testUpstream()
	defer u.close()
	ctx := context.Background()
	for round := range 3 {
		for _, path := range []string{"/stream", "/length", "/empty", "/early", "/error", "/large"} {
			body := []byte(fmt.Sprintf(`{"round":%d}`, round))
			resp, err := u.post(ctx, srv.URL+path, body, "text/event-stream")
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err != nil {
				t.Fatalf("%s: body: %v", path, err)
			}
			wantStatus, want := netHTTPDo(t, http.MethodPost, srv.URL+path, body)
			if resp.Status != wantStatus || string(got) != string(want) {
				t.Fatalf("%s: got %d %q, net/http %d %q", path, resp.Status, clip(got), wantStatus, clip(want))
			}
		}
	}
	// net/http's requests used connections of their own; ours one in all.
	before := conns.Load()
	for range 5 {
		fetch(t, u, srv.URL+"/stream", []byte("{}"))
	}
	if n := conns.Load() - before; n != 0 {
		t.Fatalf("%d new connections for 5 requests on a kept-alive one, want 0", n)
	}
	// Connection: close is honoured: the next request dials.
	if _, b := fetch(t, u, srv.URL+"/close", []byte("{}")); b != "bye" {
		t.Fatalf("close: %q", b)
	}
	before = conns.Load()
	fetch(t, u, srv.URL+"/length", nil)
	if n := conns.Load() - before; n != 1 {
		t.Fatalf("%d new connections after Connection: close, want 1", n)
	}
}

// TestUpstreamUnreadBodyClosesConnection: a body closed before its end
// does not give its connection back.
func TestUpstreamUnreadBodyClosesConnection(t *testing.T) {
	srv, conns := countingServer(t, engineLike())
	u := testUpstream()
	defer u.close()
	// The large answer is still arriving when its body is closed; the
	// small one has arrived whole, in the connection's buffer.
	for _, path := range []string{"/large", "/length", "/length"} {
		resp, err := u.post(context.Background(), srv.URL+path, []byte(strings.Repeat("y", 200)), "")
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 100)
		if _, err := io.ReadFull(resp.Body, buf); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if _, err := resp.Body.Read(buf); err == nil {
			t.Fatal("a closed body still reads")
		}
	}
	if n := conns.Load(); n != 3 {
		t.Fatalf("%d connections for 3 answers closed unread, want 3", n)
	}
}

// TestUpstreamContextEndsRead: a context cancelled while the answer is
// awaited, or while its body streams, ends the read at once with the
// context's error, and the connection is not used again.
func TestUpstreamContextEndsRead(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	mux := http.NewServeMux()
	mux.HandleFunc("/hang", func(w http.ResponseWriter, r *http.Request) { <-release })
	mux.HandleFunc("/half", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		<-release
	})
	srv, conns := countingServer(t, mux)
	u := testUpstream()
	defer u.close()

	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := u.post(ctx, srv.URL+"/hang", []byte("{}"), ""); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("hung answer: err %v, want the context's deadline", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the context's end took %s to end the request", d)
	}

	ctx2, cancel2 := context.WithCancel(context.Background())
	resp, err := u.post(ctx2, srv.URL+"/half", []byte("{}"), "")
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "data: 1\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	cancel2()
	_, err = io.ReadAll(br)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("body read after cancel: %v, want context.Canceled", err)
	}
	resp.Body.Close()
	before := conns.Load()
	fetch(t, u, srv.URL+"/hang-not", []byte("{}"))
	if n := conns.Load() - before; n != 1 {
		t.Fatalf("%d new connections after a cancelled read, want 1 (it is not reused)", n)
	}
}

// TestUpstreamEngineClosedIdle: kept-alive connections the engine closed
// while idle (a restart) are not used for the request: one idle for a
// while is peeked and replaced; on one idle for less the request fails
// before any answer and goes once more on a new connection, not on the
// next kept one.
func TestUpstreamEngineClosedIdle(t *testing.T) {
	for _, aged := range []bool{true, false} {
		srv, conns := countingServer(t, engineLike())
		u := testUpstream()
		do := func() {
			if _, b := fetch(t, u, srv.URL+"/length", []byte("x")); b != "<x>" {
				t.Fatalf("got %q", b)
			}
		}
		// Two connections kept: two answers read at once.
		r1, err1 := u.post(context.Background(), srv.URL+"/length", []byte("x"), "")
		r2, err2 := u.post(context.Background(), srv.URL+"/length", []byte("x"), "")
		for _, a := range []struct {
			r   *upResponse
			err error
		}{{r1, err1}, {r2, err2}} {
			if _, b, err := readAnswer(a.r, a.err); err != nil || b != "<x>" {
				t.Fatalf("got %q, %v", b, err)
			}
		}
		u.mu.Lock()
		kept := u.idle[strings.TrimPrefix(srv.URL, "http://")]
		if len(kept) != 2 {
			t.Fatalf("%d connections kept, want 2", len(kept))
		}
		for _, c := range kept {
			if aged {
				c.idleAt = c.idleAt.Add(-peekAfter)
			}
		}
		c := kept[0]
		u.mu.Unlock()
		srv.CloseClientConnections()
		// The close is the server's, in flight.
		poll.Until(t, 5*time.Second, time.Millisecond, func() error {
			if stillOpen(c.nc) {
				return errors.New("the engine's close has not arrived")
			}
			return nil
		})
		do()
		if n := conns.Load(); n != 3 {
			t.Fatalf("aged %v: %d connections, want 3 (the closed ones replaced by one)", aged, n)
		}
		u.close()
	}
}

func TestRetryFresh(t *testing.T) {
	for _, c := range []struct {
		reused, got bool
		err         error
		want        bool
	}{
		{true, false, io.EOF, true},
		{true, false, fmt.Errorf("read: %w", errConnReset), true},
		{true, true, io.ErrUnexpectedEOF, false}, // part of the answer came: the engine took the request
		{false, false, io.EOF, false},            // a new connection: the engine's own answer
		{true, false, context.Canceled, false},   // the caller's end
		{true, false, errors.New("malformed"), false},
	} {
		if got := retryFresh(c.reused, c.got, c.err); got != c.want {
			t.Errorf("retryFresh(%v, %v, %v) = %v, want %v", c.reused, c.got, c.err, got, c.want)
		}
	}
}

// rawServer answers every request on a connection with answer, then
// closes the connection.
func rawServer(t testing.TB, answer []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				br := bufio.NewReader(nc)
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				nc.Write(answer)
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

// readAnswer is what a client read of an answer: status and body, or an error.
func readAnswer(resp *upResponse, err error) (int, string, error) {
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.Status, string(b), err
}

// upstreamAgainstNetHTTP checks that what the legs' client accepts of an
// answer, net/http accepts and reads the same.
func upstreamAgainstNetHTTP(t testing.TB, answer []byte) {
	url := rawServer(t, answer)
	u := testUpstream()
	defer u.close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, body, err := readAnswer(u.post(ctx, url+"/v1/completions", []byte("{}"), ""))
	tr := &http.Transport{DisableCompression: true}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader("{}"))
	var nst int
	var nbody string
	resp, nerr := tr.RoundTrip(req)
	if nerr == nil {
		var b []byte
		b, nerr = io.ReadAll(resp.Body)
		resp.Body.Close()
		nst, nbody = resp.StatusCode, string(b)
	}
	if err == nil && (nerr != nil || st != nst || body != nbody) {
		t.Fatalf("answer %q: read %d %q, net/http %d %q (%v)", answer, st, body, nst, nbody, nerr)
	}
}

var upstreamSeeds = []string{
	"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n2\r\nhi\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end",
	"HTTP/1.0 200 OK\r\n\r\nold",
	"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
	"HTTP/1.1 103 Early Hints\r\nLink: x\r\n\r\nHTTP/1.1 500 Internal Server Error\r\nContent-Length: 3\r\n\r\nbad",
	"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
	"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
	"HTTP/1.1 200 OK\r\nContent-Length: +2\r\n\r\nab",
	"HTTP/1.1 204 No Content\r\n\r\n",
	"HTTP/1.1 2000 OK\r\n\r\n",
	"HTTP/1.1 200\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\nContent-Length: 1\n\nx",
	"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nx",
	"HTTP/1.1 200 OK\r\n Folded: x\r\nContent-Length: 1\r\n\r\nx",
	"HTTP/1.1 200 OK\r\nBad Key: x\r\nContent-Length: 1\r\n\r\nx",
	"garbage",
	"",
}

// TestUpstreamAnswersAsNetHTTP: seeds of FuzzUpstreamAnswer, each also
// read on the path a stream takes.
func TestUpstreamAnswersAsNetHTTP(t *testing.T) {
	for _, s := range upstreamSeeds {
		upstreamAgainstNetHTTP(t, []byte(s))
	}
	// The well-formed ones are read, not refused.
	for _, s := range upstreamSeeds[:8] {
		url := rawServer(t, []byte(s))
		u := testUpstream()
		if _, _, err := readAnswer(u.post(context.Background(), url, []byte("{}"), "")); err != nil {
			t.Errorf("answer %q refused: %v", s, err)
		}
		u.close()
	}
}

// FuzzUpstreamAnswer: whatever an engine answers, what the legs' client
// reads net/http reads the same (it may refuse more).
func FuzzUpstreamAnswer(f *testing.F) {
	for _, s := range upstreamSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, answer []byte) {
		upstreamAgainstNetHTTP(t, answer)
	})
}
