package tcp

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/connex/connex/transport"
)

// registration is memory exposed to remote readers.
//
// mu is read-held by a server connection for exactly as long as it hands mem
// to the kernel (one writev batch) and write-held by Deregister, which is
// how Deregister waits out in-progress writes. A connection never holds two
// registrations' locks at once, so Deregister cannot deadlock against it.
type registration struct {
	b      *Backend
	id     uint64
	secret [8]byte
	key    []byte
	n      uint64 // len(mem), immutable so range checks need no lock
	// extents, if set, are the only readable ranges, in their periodic
	// form; immutable.
	extents *transport.PeriodicExtents

	mu   sync.RWMutex
	mem  []byte      // nil after Deregister; guarded by mu
	dead atomic.Bool // set by Deregister before it takes mu

	once sync.Once
}

var _ transport.Registration = (*registration)(nil)

// RemoteKey returns the 16-byte key: id (big-endian) followed by the secret.
func (r *registration) RemoteKey() []byte { return append([]byte(nil), r.key...) }

// RemoteAddr is 0: readers name byte i of the memory as offset i.
func (r *registration) RemoteAddr() uint64 { return 0 }

// Len is the number of registered bytes.
func (r *registration) Len() int { return int(r.n) }

// Deregister revokes remote access and returns once no server goroutine
// reads the memory any more. Writes that do not finish within
// Config.DeregisterGrace (a reader that stopped draining its socket) are cut
// by closing their connection. It is idempotent; concurrent callers all
// return only after the memory is released.
func (r *registration) Deregister() error {
	r.once.Do(func() {
		r.b.regMu.Lock()
		delete(r.b.regs, r.id)
		r.b.regMu.Unlock()
		r.dead.Store(true)

		t := time.AfterFunc(r.b.cfg.DeregisterGrace, func() { r.b.abortWriters(r) })
		r.mu.Lock()
		t.Stop()
		r.mem = nil
		r.mu.Unlock()
	})
	return nil
}

// abortWriters closes every server connection that is writing from r.
func (b *Backend) abortWriters(r *registration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for sc := range b.conns {
		if sc.writing.Load() == r {
			b.log.Warn("tcp deregister: reader not draining; closing its connection",
				"reg", r.id, "peer", sc.raw.RemoteAddr().String(), "grace", b.cfg.DeregisterGrace)
			_ = sc.raw.Close()
		}
	}
}

// allows reports whether [off, off+n) lies inside the registration and, if
// it has extents, inside one of them.
func (r *registration) allows(off, n uint64) bool {
	if off > r.n || n > r.n-off {
		return false
	}
	if r.extents == nil {
		return true
	}
	return r.extents.Allows(off, n)
}
