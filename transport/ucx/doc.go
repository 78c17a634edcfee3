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
// and its memory stays mapped until Close. Allocate (below) is the
// supported way to share UCX-allocated memory.
//
// # Shared regions: one-sided reads at memory speed
//
// For memory UCX allocates itself, its shared-memory transports serve GETs
// truly one-sided: the reader's UCX maps the holder's segment when it
// unpacks the rkey, and a GET is a copy by the reader's CPU. connexd
// therefore offers engines KV memory it allocates (region.create):
//
//   - Allocate has UCX allocate POSIX shared memory (UCP_MEM_MAP_ALLOCATE;
//     the context's ALLOC_PRIO puts the posix transport first) and finds the
//     file behind it in /proc/self/maps: UCX unlinks it at once and keeps the
//     descriptor, so connexd hands the engine /proc/<pid>/fd/<n> opened
//     (kvmem/handover: any uid) and the engine maps it. Nothing is left in
//     /dev/shm if a process dies; the memory lives until the last mapping
//     goes. Without the posix transport Allocate fails and connexd uses a
//     memfd, which peers read through the checked protocol.
//   - Register and RegisterExtents on such memory hand out shared keys: a
//     checked registration (extents, token, revocable) plus the allocation's
//     UCX rkey, a random allocation id and the holder's process identity.
//   - A reader on the same host unpacks the rkey once per endpoint and asks
//     ucp_rkey_ptr where the segment is mapped; if it is (same host, shared
//     memory transport in the reader's list), the Get copies from that
//     mapping on the calling goroutine plus GOMAXPROCS-1 helpers, 1 MiB
//     grains at a time, with no UCX request per piece and no holder CPU
//     (Config.SharedReads "map", the default). SharedReads "get" posts
//     ucp_get_nbx on the owner thread instead, which UCX serves with a
//     memcpy from the same mapping, one GET after another. A reader that
//     cannot map the segment (another host, no shared-memory transport)
//     reads the same key through its checked registration, so every key
//     works everywhere and no GET is ever emulated by the holder's CPU
//     on memory it might unmap.
//   - Liveness: the mapping stays readable after the holder died, so the
//     reader checks the holder process after every mapped copy; a dead
//     holder fails the Get with ErrPeerGone (TestSharedHolderProcessKilled).
//     The first check of a process verifies pid and start time in /proc
//     and opens a pidfd; later checks poll the pidfd (one syscall, ~1.5 µs,
//     where /proc cost 18 µs in a test and 60–1000 µs inside connexd on
//     the critical path of every batch; liveness.go). A killed holder
//     counts as gone once its last thread has exited, 15–25 ms after
//     SIGKILL in the test. A SIGSTOPped holder's memory is read without
//     its CPU (TestSharedHolderProcessStopped).
//   - Revocation: the one-sided path cannot be revoked; Deregister revokes
//     the checked path only. Safety rests on the lease protocol, as for
//     RDMA: connexd never frees blocks while a pull is within its deadline,
//     and a puller stops reading at its deadline. Reads are bounded by the
//     reader to the registration's span; the puller checks every read
//     against the hold's segments before reading.
//   - Endpoint reuse: the mapping lives as long as the rkey, which lives as
//     long as the UCP endpoint. An endpoint that read shared keys therefore
//     stays open for EndpointLinger (30 s) after its last Endpoint closed, so
//     the next pull neither unpacks nor first-touches the segment again.
//     Where each allocation is mapped is cached on the endpoint (under a
//     mutex, one entry per allocation whatever the registration's offset)
//     so a Get needs no round trip to the owner thread; releasing the
//     endpoint (close, linger expiry, a forced close after another Get's
//     deadline) leaves the shared rkeys to the last mapped copy still
//     reading (TestMappedCopySurvivesEndpointClose). A busy endpoint never
//     lingers out, so each lingering Close also unmaps the allocations no
//     copy used for EndpointLinger: a freed holder allocation stays mapped
//     here (its memory in use) for at most about that long.
//   - Allocation cost: UCX commits the whole allocation inside
//     ucp_mem_map, on the owner thread, so creating a large region stalls
//     this Backend's data plane meanwhile (measured 0.25-1.35 s per GiB
//     here). Create regions when an engine starts, not under load.
//   - Address reuse: a freed allocation's address and descriptor number are
//     soon reused, and UCX's rkey bytes for the new one can be identical;
//     the rkey cache is keyed by the allocation id as well, or a reader
//     would read the stale mapping (TestSharedReusedAddressReadsNewMemory).
//
// Throughput of each read path against memcpy: BENCHMARKS.md (make bench-pull).
//
// # Read modes: checked (default) and onesided
//
// Config.Reads (connexd: ucx_reads) picks what kind of key Register hands
// out; a reader follows the key, so Backends in different modes
// interoperate.
//
//   - "checked" (the default): the protocol above. Revocable and checked by
//     the holder, but every byte costs the holder's CPU a copy into UCX's
//     eager buffer and the reader's CPU a copy out of it.
//   - "onesided": Register does ucp_mem_map of the caller's memory (no
//     ALLOCATE), packs UCX's rkey and puts it in a key that also carries the
//     registered extent and the holder's identity (pid, process start time,
//     a hash of the boot id and pid namespace). The reader rejects any op
//     outside the extent with ErrNotRegistered before reading anything. A
//     reader on the same host then copies with process_vm_readv(2) (Linux
//     CMA) from the calling goroutine, up to 4 MiB and 1024 iovecs per call,
//     spread over up to GOMAXPROCS (at most 4) goroutines, checking the
//     context between calls: no holder CPU, no UCX request, one kernel copy.
//     Elsewhere, or when the kernel refuses (EPERM: Yama ptrace_scope >= 1,
//     another user; logged once per endpoint), the reader posts raw
//     ucp_get_nbx batches with the unpacked rkey (cached per endpoint), the
//     Alloc path: one-sided on RDMA hardware, emulated by the holder's CPU on
//     TCP and shared memory.
//
// Why not UCX's own cma transport: UCX 1.13 never uses it for ucp_get_nbx of
// host memory. Its protocol table (UCX_PROTO_INFO=y) says "software
// emulation" for ucp_get* with cma,tcp,self, cma,posix,self and cma,sm,self,
// with UCX_PROTO_ENABLE=n or y; cma only ever serves AM rendezvous, and with
// peer error handling it is not even selected as a lane. Measured here:
// ucx_perftest -t ucp_get with UCX_TLS=cma,tcp,self moves 0.99 GB/s (TCP
// emulation), and raw ucp_get_nbx of registered memory with cma,tcp,self ran
// at 0.65-0.87 GB/s, slower than checked reads. So the onesided mode does the
// CMA copy itself; the default transport list of a onesided Backend is
// OneSidedDefaultTLS ("tcp,self"), which lets UCX use peer error handling
// for the endpoint it still needs (wire-up, checked keys, the fallback).
//
// The kernel bounds this path: process_vm_readv pins and copies page by page,
// about half of a user-space memcpy (figures: BENCHMARKS.md); only mapping the
// holder's pages into the reader (XPMEM, or mapping the shared region file)
// would reach memcpy.
//
// Tradeoffs of onesided mode:
//
//   - Not revocable. ucp_mem_unmap (Deregister) does not stop a reader that
//     kept the key: process_vm_readv needs no rkey, and UCX 1.13 does not
//     revoke unpacked rkeys either. Tested (TestOneSidedDeregisterThenGet):
//     after Deregister a GET still returns the bytes while the caller keeps
//     them mapped; once the memory is unmapped a CMA GET fails with
//     ErrNotRegistered (EFAULT or a short read), and neither process
//     crashes. Over the ucp_get_nbx fallback on TCP or shared memory, the
//     holder's CPU copies whatever address is asked, and a GET of unmapped
//     memory would crash the holder (SIGSEGV). Safety therefore rests on the
//     lease protocol: connexd never frees blocks while a pull is within its
//     deadline, keeps the region mapped until its engine is gone, and a
//     puller stops reading at its deadline, before the holder abandons it.
//   - Bounds are checked by the reader only. A reader that forges a key can
//     read any memory of the holder process that its own uid could read
//     with ptrace anyway (CMA's permission is ptrace's).
//   - Liveness: a SIGKILLed holder fails the Get with ErrPeerGone (ESRCH, or
//     the pid no longer names the process with the key's start time; the
//     start time is checked before and after each Get, so a reused pid is
//     never read from unnoticed); measured 0.3 ms. A SIGSTOPped holder's
//     memory stays readable, so the Get completes with the right bytes
//     (measured 7 ms for 64 MiB): a frozen holder is the lease's and the
//     cluster's to detect, as with RDMA. Over the ucp_get_nbx fallback a
//     killed holder shows up as UCS_ERR_ENDPOINT_TIMEOUT (12 ms with peer
//     error handling) and a stopped one as ErrTimeout at the deadline.
//
// # Memory whose file shrank
//
// UCX copies registered memory in C, where a page beyond its file's end
// (an engine truncated its region) raises SIGBUS and would kill the
// process. Open installs a SIGBUS handler that survives such faults and
// Backend implements transport.FaultGuard; faultguard.go says how a fault
// becomes transport.ErrFault for the Get or the holder's reply that
// touched the memory.
//
// # Known UCX 1.13 hazards
//
//   - CMA: when a holder dies during a process_vm_readv, UCX calls ucs_fatal
//     and aborts the reader's process, unless the endpoint has peer error
//     handling (lists of only tcp, cma and self). The default transport list
//     of checked mode is therefore SafeDefaultTLS ("^cma,tcp": TCP lanes can trip a
//     wire-up assertion when a peer dies, see SafeDefaultTLS); naming cma in
//     Config.TLS or UCX_TLS opts in. (Onesided mode's own CMA reads are not
//     UCX's and just return ESRCH.)
//   - Raw RMA GETs (Alloc'd memory, and onesided keys read through the
//     ucp_get_nbx fallback) are UCX requests too; if a forced
//     close does not complete them, Get returns cancelGrace after its
//     deadline and leaves the destination buffers pinned.
//   - Destroying a worker: ucp_worker_destroy purges what is still queued
//     on the endpoints UCX made itself (a holder's reply endpoints to its
//     readers, which only the worker's destruction ends), and UCX 1.13 and
//     older assert (ucs_fatal: the process aborts) on a wire-up reply left
//     queued there for a peer that died or stopped in the middle of a
//     wire-up (the assertion went in openucx/ucx#8175). Nothing the caller
//     sees rules that out, so on those versions Backend.Close unmaps the
//     Backend's registrations and leaves the worker and its context to the
//     process's exit (a few descriptors, sockets and megabytes each;
//     AbandonedWorkers counts them); later UCX destroys them as before. A
//     side effect: a peer reading from a Backend closed this way sees its
//     connections stay open and silent until the process exits, so its Get
//     ends at its own deadline (ErrTimeout) rather than with ErrPeerGone.
//     connexd closes its Backend only as it exits.
package ucx
