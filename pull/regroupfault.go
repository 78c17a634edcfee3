package pull

import (
	"fmt"
	"runtime/debug"

	"github.com/connex/connex/transport"
)

// regroupFaulting runs a regroup — Go and assembly copies into the
// destination region — with a memory fault in it turned into
// transport.ErrFault for the pull rather than a crash of connexd: an engine
// that truncated its region file under a translated pull (a restart that
// re-creates it) makes the copy's stores fault with SIGBUS. Without this,
// only the data planes' own copies are guarded (TCP's socket reads, UCX's
// fault guard), and a fault in Go code is fatal.
func regroupFaulting(f func()) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			fe, ok := r.(interface{ Addr() uintptr })
			if !ok {
				panic(r) // not a fault: a bug, as before
			}
			err = fmt.Errorf("%w: the destination region faulted at %#x during the regroup (its file shrank?)", transport.ErrFault, fe.Addr())
		}
	}()
	f()
	return nil
}
