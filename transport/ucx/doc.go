// Package ucx is Connex's UCX data plane: a small cgo binding to libucp
// (UCX 1.13+) and a transport.Backend on top of it.
//
// Build with `-tags ucx` and cgo enabled; without either, Open returns an
// error wrapping transport.ErrUnavailable and Available reports false, so the
// rest of the project builds with CGO_ENABLED=0. This is the only package in
// the module that imports "C" (TestOnlyUCXUsesCgo checks it).
//
// # Threading model
//
// Each Backend owns one UCP context and one UCP worker, created with
// UCS_THREAD_MODE_SINGLE. Exactly one goroutine, locked to its OS thread with
// runtime.LockOSThread and never unlocked, creates the worker and makes every
// libucp call on it: endpoint creation and close, memory map/unmap, rkey
// pack/unpack, ucp_get_nbx, ucp_worker_progress and ucp_worker_arm. Other
// goroutines hand it closures through a channel and wake it through an eventfd
// when it sleeps. Why:
//
//   - UCP workers are not goroutine-aware. SINGLE mode promises UCX that one
//     thread uses the worker; a goroutine may migrate between threads at every
//     cgo call, so only a locked goroutine can keep that promise. SERIALIZED
//     mode would let any thread call in under our own lock, but every caller
//     would then contend for it, and UCX would add its own locking on each
//     call; one owner needs neither.
//   - Completion callbacks (GET done, endpoint error) run inside
//     ucp_worker_progress on the owner thread and only update counters in C
//     memory; they never call back into Go. The owner polls those counters
//     after each progress call, so a completion costs no cgo transition.
//   - Submission is batched: one closure posts a whole Get (thousands of
//     GETs) with one cgo call, and one cgo call progresses the worker several
//     times. There is no cgo call per small block.
//   - Active-message handlers (holder: check and reply; reader: copy or
//     start the rendezvous receive) are C functions run inside progress on
//     the owner thread, so the registration and slot tables need no locks.
//   - A holder must progress: for memory that UCX did not allocate, shared
//     memory and TCP GETs are emulated with active messages that the holder's
//     CPU answers. The owner loop spins briefly after activity and then sleeps
//     in poll(2) on the worker's event fd (after ucp_worker_arm) and the wake
//     eventfd, so an idle holder costs nothing and a busy one answers at once.
//
// # Liveness and peer death
//
// UCX's peer error handling (UCP_ERR_HANDLING_MODE_PEER) excludes the shared
// memory transports in UCX 1.13: asking for it either fails endpoint creation
// or silently falls back to TCP. The backend therefore asks for PEER mode only
// when the configured transports (Config.TLS, else UCX_TLS) are TCP only;
// then a dead peer surfaces within tens of milliseconds as an endpoint error,
// mapped to transport.ErrPeerGone. On shared memory a dead or stopped holder
// is silent, so liveness comes from outside UCX: every Get runs under the
// caller's context, and when it ends the owner force-closes the endpoint
// (UCP_EP_CLOSE_FLAG_FORCE), which completes every in-flight GET on it with
// UCS_ERR_CANCELED. Get returns an error wrapping transport.ErrTimeout or
// transport.ErrCanceled as soon as UCX has released the destination buffers.
// Other Gets that shared the force-closed endpoint fail with
// transport.ErrPeerGone; the next Get on the Endpoint reconnects.
//
// # Checked GETs
//
// UCX 1.13's ucp_get_nbx on memory it did not allocate is emulated: the
// holder's progress thread copies whatever address a request names, without
// checking the rkey. Measured here: after ucp_mem_unmap a GET still returned
// the old bytes, and over TCP a GET of unmapped memory crashed the holder
// with SIGSEGV. That breaks "memory outside registered regions is never
// readable" and "deregistered memory is never read", so Register'd memory is
// read with a small request/reply protocol on UCP active messages instead:
//
//   - the reader sends {slot, registration id, 64-bit random token, addr,
//     len} (CX_AM_GET_REQ, header only);
//   - the holder's handler (C, on the owner thread) looks the registration
//     up in its table, checks token and bounds, and replies with
//     ucp_am_send_nbx from the registered memory, or with UCS_ERR_NO_ELEM
//     (transport.ErrNotRegistered) and no data;
//   - replies are always eager (UCP_AM_SEND_FLAG_EAGER): UCX assembles them
//     in its own buffer and the reader's handler copies them into the
//     destination, so a canceled GET can never be written to later.
//     Rendezvous would save a copy, but UCX 1.13 cannot cancel a rendezvous
//     receive, and force-closing an endpoint with one in flight trips an
//     assertion that aborts the process (seen in TestHolderProcessStopped).
//
// Deregister removes the table entry first (new requests are refused) and
// then waits for replies still being sent from the memory, force-closing
// their endpoints after DeregisterGrace. Slot ids carry a generation, so a
// late reply to a canceled GET is dropped, never written.
//
// Alloc (UCP_MEM_MAP_ALLOCATE) keeps the raw ucp_get_nbx path, which is
// truly one-sided on shared memory but cannot be revoked; it is experimental
// and its memory stays mapped until Close.
//
// # Known UCX 1.13 hazards
//
//   - CMA: when a holder dies during a process_vm_readv, UCX calls ucs_fatal
//     and aborts the reader's process, unless the endpoint has peer error
//     handling (lists of only tcp, cma and self). The default transport list is therefore
//     SafeDefaultTLS ("^cma"); naming cma in Config.TLS or UCX_TLS opts in.
//   - Raw RMA GETs (Alloc'd memory only) are UCX requests too; if a forced
//     close does not complete them, Get returns cancelGrace after its
//     deadline and leaves the destination buffers pinned.
package ucx
