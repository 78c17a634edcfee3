// C glue between Go and libucp. Everything here runs on the worker's owner
// thread (see doc.go); nothing calls back into Go.
#ifndef CONNEX_CX_H
#define CONNEX_CX_H

#include <stddef.h>
#include <stdint.h>
#include <ucp/api/ucp.h>

// Active message ids of the checked GET protocol (see doc.go).
#define CX_AM_GET_REQ 0x4358
#define CX_AM_GET_REP 0x4359

// cx_req_hdr is a reader's GET request: read len bytes at addr of the
// holder's registration reg (index<<32 | generation), proving token.
typedef struct cx_req_hdr {
	uint64_t slot;      // reader's slot id (index<<32 | generation)
	uint64_t nonce;     // random per GET; the reply must echo it (cx_nonce)
	uint64_t reg;
	uint64_t token;
	uint64_t addr;
	uint64_t len;
} cx_req_hdr;

// cx_rep_hdr heads the holder's reply; the data follows unless status fails.
typedef struct cx_rep_hdr {
	uint64_t slot;
	uint64_t nonce;     // the request's: a reply without it is no reply
	int64_t status;
} cx_rep_hdr;

struct cx_reg;

// cx_reply is one reply send in flight on the holder.
typedef struct cx_reply {
	cx_rep_hdr hdr;     // must live until the send completes
	struct cx_reg *reg;
	struct cx_worker *w;
	ucp_ep_h ep;
	struct cx_reply *prev, *next;
} cx_reply;

// cx_reg is a holder-side registration as the request handler sees it.
typedef struct cx_reg {
	uint64_t id;        // index<<32 | generation
	uint64_t token;
	uint64_t base, len;
	ucp_mem_h memh;
	int64_t inflight;   // replies whose send has not completed
	cx_reply *replies;  // those replies
	int32_t active;
	int32_t pad;
	// ext, if next > 0, lists the only readable ranges as next sorted,
	// disjoint (offset from base, length) pairs, repeated periods times at
	// stride (periods 1: the list is all of them). A hold's extents are one
	// run of blocks per layer and plane at the layout's plane stride: kept
	// as one period, 64 extents cost 16 bytes instead of 1 KiB.
	uint64_t *ext;
	uint64_t next;
	uint64_t stride, periods;
} cx_reg;

// cx_slot is a reader-side GET waiting for its reply (state 1) or
// receiving its data by rendezvous (state 2); state 0 is free.
typedef struct cx_slot {
	uint32_t gen;
	int32_t state;
	uint64_t nonce;     // what its reply must carry back
	uint64_t dst, len;
	struct cx_batch *b;
} cx_slot;

// cx_worker is one UCP context plus its single worker.
typedef struct cx_worker {
	ucp_context_h ctx;
	ucp_worker_h worker;
	int efd;            // ucp_worker_get_efd
	int wakefd;         // eventfd written by submitting goroutines
	int64_t ep_errors;  // bumped by the endpoint error callback
	// holder: registrations by index
	cx_reg **regs;
	uint32_t *reg_gen;
	uint32_t nregs, capregs;
	uint32_t reg_scan;  // no free index below this one (add scans from here)
	uint32_t pad3;
	// reader: request slots
	cx_slot *slots;
	uint32_t *free_slots;
	uint32_t nfree, capslots;
	int64_t bad_replies; // replies naming no live slot (late or forged)
	int64_t refused;     // requests the holder refused
	int64_t replies;     // holder reply sends in flight
	int32_t eager_replies; // force eager protocol for replies
	int32_t pad2;
	cx_reg refusals;     // replies carrying a refusal
	// reader: unpredictable nonces for GETs (getrandom, a block at a time)
	uint64_t nonces[64];
	uint32_t nnonces;
	uint32_t pad4;
} cx_worker;

// cx_ep is an endpoint and the status its error callback reported.
typedef struct cx_ep {
	ucp_ep_h ep;
	cx_worker *w;
	int32_t status;     // UCS_OK until the error callback fires
	int32_t pad;
} cx_ep;

// cx_batch counts the GETs of one batch that are still in flight. The
// completion callback decrements it; Go polls it after each progress call.
typedef struct cx_batch {
	int64_t pending;
	int32_t status;     // first failure, UCS_OK if none
	int32_t pad;
} cx_batch;

// cx_get is one GET of a batch: a checked GET (reg != 0, active message
// request/reply) or a raw RMA GET with rkey (UCX-allocated memory).
typedef struct cx_get {
	uint64_t local;     // destination address
	uint64_t remote;    // remote virtual address
	uint64_t len;
	uint64_t rkey;      // ucp_rkey_h (RMA only)
	uint64_t reg;       // holder registration id (checked GET only)
	uint64_t token;
	cx_req_hdr hdr;     // request header; lives until the batch completes
} cx_get;

ucs_status_t cx_open(const char *tls, cx_worker **out);
// cx_nonce is an unpredictable 64-bit value for one checked GET.
uint64_t cx_nonce(cx_worker *w);
void cx_close(cx_worker *w);
// cx_abandon leaves w to the process's exit instead of destroying it
// (on UCX 1.13 and older: worker.go's destroyAborts): only its wake-up
// descriptor is closed.
void cx_abandon(cx_worker *w);
ucs_status_t cx_address(cx_worker *w, void **addr, size_t *len);
void cx_address_release(cx_worker *w, void *addr);

ucs_status_t cx_ep_create(cx_worker *w, const void *addr, int err_peer, cx_ep *e);
// cx_ep_close starts closing; returns a request to poll with cx_req_poll, or
// NULL when done.
void *cx_ep_close(cx_worker *w, cx_ep *e, int force, ucs_status_t *st);
// cx_req_poll returns UCS_INPROGRESS or the final status (and frees req).
ucs_status_t cx_req_poll(void *req);

ucs_status_t cx_mem_map(cx_worker *w, void *addr, size_t len, int allocate,
			ucp_mem_h *memh, void **addr_out, void **rkey, size_t *rkey_len);
ucs_status_t cx_mem_unmap(cx_worker *w, ucp_mem_h memh);

// Holder registration table for checked GETs.
cx_reg *cx_reg_add(cx_worker *w, uint64_t base, uint64_t len, uint64_t token, ucp_mem_h memh);
// cx_reg_disable refuses new requests on r; returns replies still in flight.
int64_t cx_reg_disable(cx_worker *w, cx_reg *r);
// cx_reg_reply_eps writes the distinct endpoints r's replies are on (at
// most cap) to out and returns how many.
size_t cx_reg_reply_eps(cx_reg *r, ucp_ep_h *out, size_t cap);
// cx_reg_forget_ep and cx_worker_forget_ep drop ep from the replies of r,
// of every live registration of w and of w's refusals: ep is being closed,
// and no later close may touch it again (UCX frees it).
void cx_reg_forget_ep(cx_reg *r, ucp_ep_h ep);
void cx_worker_forget_ep(cx_worker *w, ucp_ep_h ep);
// cx_ep_force_close closes an endpoint UCX made for a peer's requests
// (none of ours), forcibly, without waiting.
void cx_ep_force_close(ucp_ep_h ep);
void cx_reg_free(cx_reg *r);
// cx_reg_set_extents restricts r to n sorted, disjoint (offset, length)
// pairs (copied; pairs that repeat one period at a fixed stride, as a
// hold's do, are kept as that period).
int cx_reg_set_extents(cx_reg *r, const uint64_t *pairs, uint64_t n);

// cx_batch_abort completes every GET of ops still waiting for a reply with
// status st (used after the endpoint they were sent on was closed).
void cx_batch_abort(cx_worker *w, cx_get *ops, int n, ucs_status_t st);
void cx_rkey_buffer_release(void *rkey);
ucs_status_t cx_rkey_unpack(cx_ep *e, const void *buf, ucp_rkey_h *out);
void cx_rkey_destroy(ucp_rkey_h rkey);
// cx_rkey_local reports whether rkey's memory is mapped into this process
// (a shared-memory segment UCX attached), i.e. whether GETs with it are
// copies by this process's CPU with no work for the holder.
int cx_rkey_local(ucp_rkey_h rkey, uint64_t raddr, void **ptr);

// cx_post posts n GETs on e, all counted in b. Returns how many were posted;
// on failure b->status holds the reason.
int cx_post(cx_ep *e, cx_get *ops, int n, cx_batch *b);

// cx_progress calls ucp_worker_progress up to max times, stopping early when
// a call reports no work. Returns the number of events progressed.
int cx_progress(cx_worker *w, int max);

// cx_wait arms the worker and sleeps on its event fd and the wake fd for at
// most timeout_ms (-1: forever). Returns 1 if it slept, 0 if arm said busy.
int cx_wait(cx_worker *w, int timeout_ms);
// cx_wake wakes a worker sleeping in cx_wait.
void cx_wake(cx_worker *w);

// Internal to cx.c and cx_checked.c (not for Go): the checked GET's active
// message handlers that cx_open installs, and the reader's slots that
// cx_post and cx_batch_abort use.
ucs_status_t cx_on_get_req(void *arg, const void *header, size_t header_length, void *data, size_t length,
			   const ucp_am_recv_param_t *param);
ucs_status_t cx_on_get_rep(void *arg, const void *header, size_t header_length, void *data, size_t length,
			   const ucp_am_recv_param_t *param);
void cx_req_sent(void *req, ucs_status_t status, void *user_data);
int cx_slot_alloc(cx_worker *w, uint32_t *idx);
void cx_slot_done(cx_worker *w, uint32_t idx, ucs_status_t st);

#endif
