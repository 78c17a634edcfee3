package pull

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	waitpoll "github.com/connex/connex/harness/poll"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
)

// dialBackend counts Connect calls; its endpoints record Close.
type dialBackend struct {
	mu       sync.Mutex
	connects []string
	fail     error
	eps      []*dialEndpoint
}

type dialEndpoint struct {
	mu     sync.Mutex
	closed bool
}

func (e *dialEndpoint) Get(context.Context, []transport.GetOp) error { return nil }
func (e *dialEndpoint) GetProgress(context.Context, []transport.GetOp, func(int)) error {
	return nil
}
func (e *dialEndpoint) GetStrided(context.Context, []transport.StridedOp) error { return nil }
func (e *dialEndpoint) GetStridedProgress(context.Context, []transport.StridedOp, func(int)) error {
	return nil
}
func (e *dialEndpoint) Close() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	return nil
}
func (e *dialEndpoint) isClosed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

func (b *dialBackend) Name() string                                    { return "fake" }
func (b *dialBackend) Caps() transport.Caps                            { return transport.Caps{} }
func (b *dialBackend) Address() []byte                                 { return nil }
func (b *dialBackend) Register([]byte) (transport.Registration, error) { return nil, errors.New("no") }
func (b *dialBackend) Close() error                                    { return nil }
func (b *dialBackend) Connect(_ context.Context, addr []byte) (transport.Endpoint, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.connects = append(b.connects, string(addr))
	if b.fail != nil {
		return nil, b.fail
	}
	ep := &dialEndpoint{}
	b.eps = append(b.eps, ep)
	return ep, nil
}

func (b *dialBackend) dialled() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.connects...)
}

// TestDataAddrBook: the book vouches only for the address a member last
// advertised.
func TestDataAddrBook(t *testing.T) {
	var b dataAddrBook
	if b.vouches("m1", []byte("a:1")) {
		t.Fatal("empty book vouches")
	}
	b.learn("m1", []byte("a:1"))
	if !b.vouches("m1", []byte("a:1")) || b.vouches("m1", []byte("a:2")) || b.vouches("m2", []byte("a:1")) || b.vouches("m1", nil) {
		t.Fatal("vouches for the wrong member or address")
	}
	b.learn("m1", []byte("a:2")) // the member restarted on another port
	if b.vouches("m1", []byte("a:1")) || !b.vouches("m1", []byte("a:2")) {
		t.Fatal("old address still vouched for after the member moved")
	}
	for i := range maxBookMembers + 1 {
		b.learn(string(rune('A'+i%26))+string(rune(i)), []byte("x"))
	}
	b.mu.Lock()
	n := len(b.m)
	b.mu.Unlock()
	if n > maxBookMembers {
		t.Fatalf("book holds %d members, bound %d", n, maxBookMembers)
	}
}

// TestConnectEarly: an early connect happens only to a vouched address on
// this data plane; take hands it over when the descriptors name the same
// address, reports its error rather than connecting twice, and abandons
// (closes) it when they name another.
func TestConnectEarly(t *testing.T) {
	ctx := context.Background()
	var book dataAddrBook
	rc := &messages.RemoteCtrl{Member: "holder", Backend: "fake", DataAddr: []byte("h:1")}

	b := &dialBackend{}
	if e := connectEarly(ctx, b, &book, rc, time.Second); e != nil {
		t.Fatal("connected early to an address no member advertised")
	}
	book.learn("holder", []byte("h:1"))
	other := &messages.RemoteCtrl{Member: "holder", Backend: "tcp", DataAddr: []byte("h:1")}
	if e := connectEarly(ctx, b, &book, other, time.Second); e != nil {
		t.Fatal("connected early on another data plane")
	}
	if d := b.dialled(); len(d) != 0 {
		t.Fatalf("dialled %v", d)
	}

	e := connectEarly(ctx, b, &book, rc, time.Second)
	ep, err, tried := e.take([]byte("h:1"))
	if !tried || err != nil || ep == nil || ep != transport.Endpoint(b.eps[0]) {
		t.Fatalf("take(same address): ep %v err %v tried %v", ep, err, tried)
	}

	e = connectEarly(ctx, b, &book, rc, time.Second)
	ep, err, tried = e.take([]byte("h:2"))
	if tried || ep != nil || err != nil {
		t.Fatalf("take(other address): ep %v err %v tried %v", ep, err, tried)
	}
	abandoned := func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.eps) == 2 && b.eps[1].isClosed()
	}
	if !waitpoll.Wait(5*time.Second, time.Millisecond, abandoned) {
		t.Fatal("abandoned early endpoint never closed")
	}

	fb := &dialBackend{fail: transport.ErrPeerGone}
	e = connectEarly(ctx, fb, &book, rc, time.Second)
	if _, err, tried := e.take([]byte("h:1")); !tried || !errors.Is(err, transport.ErrPeerGone) {
		t.Fatalf("failed early connect: err %v tried %v", err, tried)
	}
	if d := fb.dialled(); len(d) != 1 {
		t.Fatalf("dialled %v, want one connect", d)
	}
	var nilEarly *earlyEndpoint
	if _, _, tried := nilEarly.take([]byte("h:1")); tried {
		t.Fatal("no early connect, yet tried")
	}
	nilEarly.drop()
}
