package ucx

import (
	"bytes"
	"testing"
)

// FuzzParseKey: a packed key comes from a peer (descriptors over NATS);
// whatever its bytes, parseKey answers without panicking, and a key it
// accepts packs back to exactly those bytes, so no two readings of one key
// exist.
func FuzzParseKey(f *testing.F) {
	p := procID{pid: 42, start: 7, host: [16]byte{1, 2, 3}}
	f.Add(packCheckedKey(4096, 1<<20, 3, 99))
	f.Add(packRMAKey(0, 64, []byte{1, 2, 3}))
	f.Add(packOneSidedKey(1<<40, 4096, p, []byte{9}))
	f.Add(packSharedKey(8192, 4096, 5, 6, 7, p, []byte{8, 8}))
	f.Add([]byte(keyMagic))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, k []byte) {
		rk, err := parseKey(k)
		if err != nil {
			return
		}
		if rk.base+rk.n < rk.base {
			t.Fatalf("accepted an extent that overflows: base %d n %d", rk.base, rk.n)
		}
		var again []byte
		switch rk.kind {
		case keyChecked:
			if rk.reg == 0 {
				t.Fatal("accepted a zero registration id")
			}
			again = packCheckedKey(rk.base, int(rk.n), rk.reg, rk.token)
		case keyRMA:
			again = packRMAKey(rk.base, int(rk.n), rk.rkey)
		case keyOneSided:
			again = packOneSidedKey(rk.base, int(rk.n), rk.proc, rk.rkey)
		case keyShared:
			again = packSharedKey(rk.base, int(rk.n), rk.reg, rk.token, rk.alloc, rk.proc, rk.rkey)
		default:
			t.Fatalf("accepted kind %d", rk.kind)
		}
		if !bytes.Equal(again, k) {
			t.Fatalf("key %x parsed as %+v packs back to %x", k, rk, again)
		}
	})
}

// FuzzParseAddr: a worker address comes from a peer too; an accepted one is
// the UCX address after the magic, and packs back to the input.
func FuzzParseAddr(f *testing.F) {
	f.Add(packAddr([]byte{1, 2, 3, 4}))
	f.Add([]byte(addrMagic))
	f.Fuzz(func(t *testing.T, a []byte) {
		u, err := parseAddr(a)
		if err != nil {
			return
		}
		if len(u) == 0 || !bytes.Equal(packAddr(u), a) {
			t.Fatalf("address %x parsed as %x", a, u)
		}
	})
}
