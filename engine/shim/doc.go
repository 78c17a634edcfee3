// Package shim is the Go engine shim: the small piece that sits inside an
// inference engine and talks to the engine's local connexd, only through the
// public NATS subject API (api.Client). It is the reference for every other
// shim (the vLLM connector included).
//
// What a shim does, in the order an engine meets it:
//
//   - Open: region.create (connexd allocates the KV region), MapCreated (the
//     engine receives the region's descriptor on connexd's region socket for
//     the reply's one-use token, whatever its uid, and maps it as its KV
//     memory), subscriptions to the engine's
//     notices (blocks.freed, pull.done, request.fenced), engine.register, and a
//     renewal loop that refreshes the registration every renew_ms with fresh
//     load figures (in-flight requests, free blocks).
//   - Prefill (Hold): hold.create over the blocks a prompt's KV was written
//     to. The blocks go back to the allocator only when the hold's
//     blocks.freed notice arrives (released, expired, pulled, shutdown).
//   - Decode (StartRequest, Pull): request.start (a request actor on the
//     local connexd owns the request, keeps the hold alive, releases it at
//     the end), pull.start of the hold's blocks into local blocks and the
//     wait for its pull.done notice, whose kv_load_failure_policy says what
//     to do when the load failed. Generated tokens are reported with
//     Request.Report: asynchronous, batched, off the token path; a fenced
//     (428) answer or a FencedNotice cancels the request's context so the
//     engine stops its stream at once. Request.Finish ends it (request.finish);
//     the decode blocks go back with Engine.Free.
//   - Close: stop renewing, engine.gone, unmap the region.
//
// The decisions (Allocator, progressBatch, noticeCursor) are pure and
// unit-tested, noticeCursor on the cases the vLLM connector's NoticeCursor
// runs too (testdata/notice_cursor_cases.json); Engine wires them to NATS.
package shim
