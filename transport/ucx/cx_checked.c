//go:build ucx && cgo

// The checked GET: the holder answers a reader's request (an active message)
// from a registration whose extents it checks, and the reader matches the
// replies to its slots. cx.c holds the worker, endpoints, memory and posting.

#include "cx.h"
#include "faultguard.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <unistd.h>

// ---- holder side of the checked GET ----

static void cx_reply_unlink(cx_reply *rp) {
	cx_reg *r = rp->reg;
	if (rp->prev != NULL) {
		rp->prev->next = rp->next;
	} else {
		r->replies = rp->next;
	}
	if (rp->next != NULL) {
		rp->next->prev = rp->prev;
	}
	r->inflight--;
}

static void cx_reply_sent(void *req, ucs_status_t status, void *user_data) {
	(void)status;
	cx_reply *rp = user_data;
	rp->w->replies--;
	cx_reply_unlink(rp);
	free(user_data);
	ucp_request_free(req);
}

// cx_reg_allows checks [off, off+n) against r's extents, if it has any:
// it must lie inside one of them.
static int cx_reg_allows(const cx_reg *r, uint64_t off, uint64_t n) {
	if (r->next == 0) {
		return 1;
	}
	if (r->periods > 1) {
		// Into the first period: a range inside a run of period k is that
		// run's range shifted by k strides; one that crosses periods is
		// past its run's end there too.
		if (off < r->ext[0]) {
			return 0;
		}
		uint64_t k = (off - r->ext[0]) / r->stride;
		if (k >= r->periods) {
			return 0;
		}
		off -= k * r->stride;
	}
	// The last extent starting at or before off.
	uint64_t lo = 0, hi = r->next;
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		if (r->ext[2 * mid] <= off) {
			lo = mid + 1;
		} else {
			hi = mid;
		}
	}
	if (lo == 0) {
		return 0;
	}
	uint64_t eo = r->ext[2 * (lo - 1)], el = r->ext[2 * (lo - 1) + 1];
	return off - eo <= el && n <= el - (off - eo);
}

// cx_period returns the smallest r < n dividing n such that the n sorted,
// disjoint pairs are their first r repeated n/r times, each time stride
// further on (*stride); n (and stride 0) when there is none. Sorted and
// disjoint, the first r end before the next period starts.
static uint64_t cx_period(const uint64_t *p, uint64_t n, uint64_t *stride) {
	for (uint64_t r = 1; r <= n / 2; r++) {
		if (n % r != 0) {
			continue;
		}
		uint64_t s = p[2 * r] - p[0];
		int same = s > 0;
		for (uint64_t i = r; same && i < n; i++) {
			same = p[2 * i] == p[2 * (i - r)] + s && p[2 * i + 1] == p[2 * (i - r) + 1];
		}
		if (same) {
			*stride = s;
			return r;
		}
	}
	*stride = 0;
	return n;
}

int cx_reg_set_extents(cx_reg *r, const uint64_t *pairs, uint64_t n) {
	uint64_t stride;
	uint64_t runs = cx_period(pairs, n, &stride);
	uint64_t *e = malloc(runs * 2 * sizeof(uint64_t));
	if (e == NULL) {
		return -1;
	}
	memcpy(e, pairs, runs * 2 * sizeof(uint64_t));
	r->ext = e;
	r->next = runs;
	r->stride = stride;
	r->periods = n / runs;
	return 0;
}

static cx_reg *cx_reg_lookup(cx_worker *w, uint64_t id, uint64_t token) {
	uint32_t idx = (uint32_t)(id >> 32), gen = (uint32_t)id;
	if (idx >= w->nregs || w->regs[idx] == NULL || w->reg_gen[idx] != gen) {
		return NULL;
	}
	cx_reg *r = w->regs[idx];
	if (!r->active || r->token != token) {
		return NULL;
	}
	return r;
}

// cx_on_get_req checks a request against the registration table and replies
// with the bytes, or with an error and no bytes.
ucs_status_t cx_on_get_req(void *arg, const void *header, size_t header_length,
				  void *data, size_t length, const ucp_am_recv_param_t *param) {
	cx_worker *w = arg;
	(void)data;
	(void)length;
	if (header_length != sizeof(cx_req_hdr) ||
	    !(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP) || param->reply_ep == NULL) {
		w->refused++;
		return UCS_OK;
	}
	const cx_req_hdr *h = header;
	cx_reply *rp = calloc(1, sizeof(*rp));
	if (rp == NULL) {
		return UCS_OK;
	}
	rp->hdr.slot = h->slot;
	rp->hdr.nonce = h->nonce;
	rp->ep = param->reply_ep;
	rp->w = w;
	cx_reg *r = cx_reg_lookup(w, h->reg, h->token);
	const void *src = NULL;
	size_t n = 0;
	if (r == NULL || h->addr < r->base || h->addr - r->base > r->len ||
	    h->len > r->len - (h->addr - r->base) || !cx_reg_allows(r, h->addr - r->base, h->len)) {
		rp->hdr.status = UCS_ERR_NO_ELEM;
		w->refused++;
		r = NULL;
	} else if (cx_fg_touch((const void *)(uintptr_t)h->addr, h->len)) {
		// The memory's file shrank (faultguard.c): no bytes, a clear
		// refusal, and this process lives.
		rp->hdr.status = (ucs_status_t)CX_ERR_FAULT;
		w->refused++;
		r = NULL;
	} else {
		rp->hdr.status = UCS_OK;
		src = (const void *)(uintptr_t)h->addr;
		n = h->len;
	}
	ucp_request_param_t p;
	memset(&p, 0, sizeof(p));
	p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	p.cb.send = cx_reply_sent;
	p.user_data = rp;
	if (w->eager_replies) {
		// Eager replies land in UCX's buffer and reach the destination
		// only inside cx_on_get_rep: a canceled GET can never be written
		// to later. Rendezvous receives cannot be canceled in UCX 1.13.
		p.op_attr_mask |= UCP_OP_ATTR_FIELD_FLAGS;
		p.flags = UCP_AM_SEND_FLAG_EAGER;
	}
	if (r != NULL) {
		p.op_attr_mask |= UCP_OP_ATTR_FIELD_MEMH;
		p.memh = r->memh;
		rp->reg = r;
		rp->next = r->replies;
		if (r->replies != NULL) {
			r->replies->prev = rp;
		}
		r->replies = rp;
		r->inflight++;
	} else {
		// Refusals belong to no registration; they go on the worker's
		// own list so the completion path stays uniform.
		cx_reg *none = &w->refusals;
		rp->reg = none;
		rp->next = none->replies;
		if (none->replies != NULL) {
			none->replies->prev = rp;
		}
		none->replies = rp;
		none->inflight++;
	}
	ucs_status_ptr_t sr = ucp_am_send_nbx(param->reply_ep, CX_AM_GET_REP, &rp->hdr,
					      sizeof(rp->hdr), src, n, &p);
	if (!UCS_PTR_IS_PTR(sr)) { // done at once, or failed: no callback
		cx_reply_unlink(rp);
		free(rp);
	} else {
		w->replies++;
	}
	return UCS_OK;
}

// ---- reader side of the checked GET ----

void cx_slot_done(cx_worker *w, uint32_t idx, ucs_status_t st) {
	cx_slot *s = &w->slots[idx];
	cx_batch *b = s->b;
	b->pending--;
	if (st != UCS_OK && b->status == UCS_OK) {
		b->status = st;
	}
	s->state = 0;
	s->gen++;
	if (s->gen == 0) {
		s->gen = 1;
	}
	s->b = NULL;
	w->free_slots[w->nfree++] = idx;
}

static cx_slot *cx_slot_find(cx_worker *w, uint64_t id, uint32_t *idx) {
	uint32_t i = (uint32_t)(id >> 32), gen = (uint32_t)id;
	if (i >= w->capslots || w->slots[i].state == 0 || w->slots[i].gen != gen) {
		return NULL;
	}
	*idx = i;
	return &w->slots[i];
}

uint64_t cx_nonce(cx_worker *w) {
	if (w->nnonces == 0) {
		size_t got = 0;
		while (got < sizeof(w->nonces)) {
			ssize_t n = getrandom((char *)w->nonces + got, sizeof(w->nonces) - got, 0);
			if (n < 0) {
				if (errno == EINTR) {
					continue;
				}
				abort(); // no kernel randomness: no reply could be told from a forgery
			}
			got += (size_t)n;
		}
		w->nnonces = sizeof(w->nonces) / sizeof(w->nonces[0]);
	}
	return w->nonces[--w->nnonces];
}

int cx_slot_alloc(cx_worker *w, uint32_t *idx) {
	if (w->nfree == 0) {
		uint32_t cap = w->capslots ? w->capslots * 2 : 1024;
		cx_slot *ns = realloc(w->slots, cap * sizeof(*ns));
		if (ns == NULL) {
			return 0;
		}
		w->slots = ns;
		uint32_t *nf = realloc(w->free_slots, cap * sizeof(*nf));
		if (nf == NULL) {
			return 0;
		}
		w->free_slots = nf;
		for (uint32_t i = cap; i > w->capslots; i--) {
			memset(&w->slots[i - 1], 0, sizeof(cx_slot));
			w->slots[i - 1].gen = 1;
			w->free_slots[w->nfree++] = i - 1;
		}
		w->capslots = cap;
	}
	*idx = w->free_slots[--w->nfree];
	return 1;
}

typedef struct {
	cx_worker *w;
	uint64_t slot;
} cx_rndv_arg;

static void cx_rndv_done(void *req, ucs_status_t status, size_t length, void *user_data) {
	cx_worker *w = ((cx_rndv_arg *)user_data)->w;
	uint64_t id = ((cx_rndv_arg *)user_data)->slot;
	(void)length;
	free(user_data);
	uint32_t idx;
	if (cx_slot_find(w, id, &idx) != NULL) {
		cx_slot_done(w, idx, status);
	}
	ucp_request_free(req);
}

ucs_status_t cx_on_get_rep(void *arg, const void *header, size_t header_length,
				  void *data, size_t length, const ucp_am_recv_param_t *param) {
	cx_worker *w = arg;
	if (header_length != sizeof(cx_rep_hdr)) {
		w->bad_replies++;
		return UCS_OK;
	}
	const cx_rep_hdr *h = header;
	uint32_t idx;
	cx_slot *s = cx_slot_find(w, h->slot, &idx);
	if (s == NULL || s->state != 1 || h->nonce != s->nonce) {
		// A late reply for a canceled GET, or one forged: slot ids are
		// predictable and UCX says nothing of who sent an active message,
		// so only the request's random nonce makes a reply this GET's.
		// Either way rndv data is dropped and the GET waits on.
		w->bad_replies++;
		return UCS_OK;
	}
	if (h->status != UCS_OK) {
		cx_slot_done(w, idx, (ucs_status_t)h->status);
		return UCS_OK;
	}
	if (length != s->len) {
		cx_slot_done(w, idx, UCS_ERR_MESSAGE_TRUNCATED);
		return UCS_OK;
	}
	if (!(param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
		memcpy((void *)(uintptr_t)s->dst, data, length);
		cx_slot_done(w, idx, UCS_OK);
		return UCS_OK;
	}
	cx_rndv_arg *ra = malloc(sizeof(*ra));
	if (ra == NULL) {
		cx_slot_done(w, idx, UCS_ERR_NO_MEMORY);
		return UCS_OK;
	}
	ra->w = w;
	ra->slot = h->slot;
	ucp_request_param_t p;
	memset(&p, 0, sizeof(p));
	p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	p.cb.recv_am = cx_rndv_done;
	p.user_data = ra;
	s->state = 2;
	ucs_status_ptr_t r = ucp_am_recv_data_nbx(w->worker, data, (void *)(uintptr_t)s->dst,
						  s->len, &p);
	if (r == NULL) {
		free(ra);
		cx_slot_done(w, idx, UCS_OK);
	} else if (UCS_PTR_IS_ERR(r)) {
		free(ra);
		cx_slot_done(w, idx, UCS_PTR_STATUS(r));
	}
	return UCS_OK;
}

void cx_req_sent(void *req, ucs_status_t status, void *user_data) {
	(void)status;
	(void)user_data;
	ucp_request_free(req);
}

cx_reg *cx_reg_add(cx_worker *w, uint64_t base, uint64_t len, uint64_t token, ucp_mem_h memh) {
	// Scan for a free index from reg_scan, not from 0: a hold of scattered
	// blocks adds thousands of registrations at once, and a scan from 0
	// made that quadratic (65k registrations took over 5 s).
	uint32_t idx = w->nregs;
	for (uint32_t i = w->reg_scan; i < w->nregs; i++) {
		if (w->regs[i] == NULL) {
			idx = i;
			break;
		}
	}
	w->reg_scan = idx + 1;
	if (idx == w->capregs) {
		uint32_t cap = w->capregs ? w->capregs * 2 : 64;
		cx_reg **nr = realloc(w->regs, cap * sizeof(*nr));
		if (nr == NULL) {
			return NULL;
		}
		w->regs = nr;
		uint32_t *ng = realloc(w->reg_gen, cap * sizeof(*ng));
		if (ng == NULL) {
			return NULL;
		}
		w->reg_gen = ng;
		for (uint32_t i = w->capregs; i < cap; i++) {
			w->regs[i] = NULL;
			w->reg_gen[i] = 0;
		}
		w->capregs = cap;
	}
	cx_reg *r = calloc(1, sizeof(*r));
	if (r == NULL) {
		return NULL;
	}
	w->reg_gen[idx]++;
	if (w->reg_gen[idx] == 0) {
		w->reg_gen[idx] = 1;
	}
	r->id = ((uint64_t)idx << 32) | w->reg_gen[idx];
	r->token = token;
	r->base = base;
	r->len = len;
	r->memh = memh;
	r->active = 1;
	w->regs[idx] = r;
	if (idx == w->nregs) {
		w->nregs++;
	}
	return r;
}

int64_t cx_reg_disable(cx_worker *w, cx_reg *r) {
	uint32_t idx = (uint32_t)(r->id >> 32);
	if (r->active && idx < w->nregs && w->regs[idx] == r) {
		w->regs[idx] = NULL;
		if (idx < w->reg_scan) {
			w->reg_scan = idx;
		}
	}
	r->active = 0;
	return r->inflight;
}

size_t cx_reg_reply_eps(cx_reg *r, ucp_ep_h *out, size_t cap) {
	size_t n = 0;
	for (cx_reply *rp = r->replies; rp != NULL && n < cap; rp = rp->next) {
		if (rp->ep == NULL) {
			continue;
		}
		size_t i = 0;
		while (i < n && out[i] != rp->ep) {
			i++;
		}
		if (i == n) {
			out[n++] = rp->ep;
		}
	}
	return n;
}

void cx_reg_forget_ep(cx_reg *r, ucp_ep_h ep) {
	for (cx_reply *rp = r->replies; rp != NULL; rp = rp->next) {
		if (rp->ep == ep) {
			rp->ep = NULL;
		}
	}
}

void cx_worker_forget_ep(cx_worker *w, ucp_ep_h ep) {
	for (uint32_t i = 0; i < w->nregs; i++) {
		if (w->regs[i] != NULL) {
			cx_reg_forget_ep(w->regs[i], ep);
		}
	}
	cx_reg_forget_ep(&w->refusals, ep);
}

void cx_ep_force_close(ucp_ep_h ep) {
	ucp_request_param_t p;
	memset(&p, 0, sizeof(p));
	p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
	p.flags = UCP_EP_CLOSE_FLAG_FORCE;
	void *req = ucp_ep_close_nbx(ep, &p);
	if (UCS_PTR_IS_PTR(req)) {
		ucp_request_free(req);
	}
}

void cx_reg_free(cx_reg *r) {
	while (r->replies != NULL) {
		cx_reply *rp = r->replies;
		r->replies = rp->next;
		free(rp);
	}
	free(r->ext);
	free(r);
}

void cx_batch_abort(cx_worker *w, cx_get *ops, int n, ucs_status_t st) {
	for (int i = 0; i < n; i++) {
		if (ops[i].reg == 0 || ops[i].hdr.slot == 0) {
			continue;
		}
		uint32_t idx;
		cx_slot *s = cx_slot_find(w, ops[i].hdr.slot, &idx);
		if (s != NULL && s->state == 1) {
			cx_slot_done(w, idx, st);
		}
	}
}
