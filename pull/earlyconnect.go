package pull

import (
	"bytes"
	"context"
	"sync"
	"time"

	"github.com/connex/connex/messages"
	"github.com/connex/connex/transport"
)

// dataAddrBook remembers the data address each holder member advertised in
// its last descriptors. Descriptors come from members over NATS; transfer
// params, which also name an address, come from engines and routers and may
// be stale or forged, so a puller dials a params address before the
// descriptors arrive only if the book vouches for it. The zero value is
// ready to use; safe for concurrent use.
type dataAddrBook struct {
	mu sync.Mutex
	m  map[string][]byte // member id -> data address
}

// maxBookMembers bounds the book: member ids churn (a restarted decode
// member may come back under a new id); beyond it the book starts over.
const maxBookMembers = 4096

// learn records addr as member's data address, replacing the one before.
func (b *dataAddrBook) learn(member string, addr []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.m[member]; ok && bytes.Equal(old, addr) {
		return
	}
	if b.m == nil || len(b.m) >= maxBookMembers {
		b.m = map[string][]byte{}
	}
	b.m[member] = bytes.Clone(addr)
}

// vouches reports whether member last advertised addr.
func (b *dataAddrBook) vouches(member string, addr []byte) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	old, ok := b.m[member]
	return ok && len(addr) > 0 && bytes.Equal(old, addr)
}

// earlyEndpoint is a connect to a holder's data address started before its
// descriptors arrived.
type earlyEndpoint struct {
	addr   []byte
	cancel context.CancelFunc
	ch     chan earlyResult
}

type earlyResult struct {
	ep  transport.Endpoint
	err error
}

// connectEarly starts connecting to rc's data address when rc is on
// backend's data plane and book vouches for the address; nil otherwise.
// The connect has stall to succeed, as a connect after the descriptors
// would.
func connectEarly(ctx context.Context, backend transport.Backend, book *dataAddrBook, rc *messages.RemoteCtrl, budget time.Duration) *earlyEndpoint {
	if rc.GetBackend() != backend.Name() || !book.vouches(rc.GetMember(), rc.GetDataAddr()) {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, budget)
	e := &earlyEndpoint{addr: rc.GetDataAddr(), cancel: cancel, ch: make(chan earlyResult, 1)}
	go func() {
		ep, err := backend.Connect(cctx, e.addr)
		e.ch <- earlyResult{ep, err}
	}()
	return e
}

// minConnectBudget is the least time a pull gives its data-plane connect:
// Linux sends a lost SYN again after 1 s and then after 3 s more, so on a
// lossy path (5 % loss: one connect in ten loses its SYN or SYN-ACK) a
// connect bounded by a 1 s stall deadline would fail where the network
// only needed a retransmit. A black-holed data plane fails the pull after
// this long instead of pull_stall_ms; a dead holder's host still answers
// with a reset at once, and a frozen holder's kernel still accepts.
const minConnectBudget = 3500 * time.Millisecond

// connectBudget is how long a pull may take to connect to its holder's
// data plane: its stall deadline, but at least minConnectBudget.
func connectBudget(stall time.Duration) time.Duration { return max(stall, minConnectBudget) }

// take returns the early connect's outcome if it went to addr (tried is
// then true; it waits for the connect to finish), or abandons it and
// returns tried=false: the caller connects to addr itself.
func (e *earlyEndpoint) take(addr []byte) (ep transport.Endpoint, err error, tried bool) {
	if e == nil {
		return nil, nil, false
	}
	if !bytes.Equal(e.addr, addr) {
		e.drop()
		return nil, nil, false
	}
	r := <-e.ch
	e.cancel()
	return r.ep, r.err, true
}

// drop abandons the early connect without waiting for it.
func (e *earlyEndpoint) drop() {
	if e == nil {
		return
	}
	e.cancel()
	go func() {
		if r := <-e.ch; r.ep != nil {
			_ = r.ep.Close()
		}
	}()
}
