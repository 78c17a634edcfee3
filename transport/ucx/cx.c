//go:build ucx && cgo

#include "cx.h"
#include "faultguard.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
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

int cx_reg_set_extents(cx_reg *r, const uint64_t *pairs, uint64_t n) {
	uint64_t *e = malloc(n * 2 * sizeof(uint64_t));
	if (e == NULL) {
		return -1;
	}
	memcpy(e, pairs, n * 2 * sizeof(uint64_t));
	r->ext = e;
	r->next = n;
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
static ucs_status_t cx_on_get_req(void *arg, const void *header, size_t header_length,
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

static void cx_slot_done(cx_worker *w, uint32_t idx, ucs_status_t st) {
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

static int cx_slot_alloc(cx_worker *w, uint32_t *idx) {
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

static ucs_status_t cx_on_get_rep(void *arg, const void *header, size_t header_length,
				  void *data, size_t length, const ucp_am_recv_param_t *param) {
	cx_worker *w = arg;
	if (header_length != sizeof(cx_rep_hdr)) {
		w->bad_replies++;
		return UCS_OK;
	}
	const cx_rep_hdr *h = header;
	uint32_t idx;
	cx_slot *s = cx_slot_find(w, h->slot, &idx);
	if (s == NULL || s->state != 1) {
		w->bad_replies++;
		return UCS_OK; // late reply for a canceled GET; rndv data is dropped
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

static void cx_req_sent(void *req, ucs_status_t status, void *user_data) {
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

void cx_reg_kill_replies(cx_reg *r) {
	// Closing an endpoint completes (and unlinks) its replies, so restart
	// the walk after each close.
	for (;;) {
		cx_reply *rp = r->replies;
		while (rp != NULL && rp->ep == NULL) {
			rp = rp->next;
		}
		if (rp == NULL) {
			return;
		}
		ucp_ep_h ep = rp->ep;
		for (cx_reply *q = r->replies; q != NULL; q = q->next) {
			if (q->ep == ep) {
				q->ep = NULL;
			}
		}
		ucp_request_param_t p;
		memset(&p, 0, sizeof(p));
		p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
		p.flags = UCP_EP_CLOSE_FLAG_FORCE;
		void *req = ucp_ep_close_nbx(ep, &p);
		if (UCS_PTR_IS_PTR(req)) {
			ucp_request_free(req);
		}
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

ucs_status_t cx_open(const char *tls, cx_worker **out) {
	ucp_config_t *cfg = NULL;
	ucs_status_t st = ucp_config_read(NULL, NULL, &cfg);
	if (st != UCS_OK) {
		return st;
	}
	if (tls != NULL && tls[0] != '\0') {
		st = ucp_config_modify(cfg, "TLS", tls);
		if (st != UCS_OK) {
			ucp_config_release(cfg);
			return st;
		}
	}
	// Memory shared with engines (Backend.Allocate) must be a POSIX
	// shared-memory file, which other processes can open and map and which
	// UCX's posix transport exposes for one-sided GETs. UCX's default order
	// tries System V segments first; put posix first and keep the rest of
	// the default list, which UCX's internal buffer pools also use (a list
	// without fallbacks starves them where posix is not loaded: TCP-only
	// contexts hang).
	(void)ucp_config_modify(cfg, "ALLOC_PRIO", "md:posix,md:sysv,huge,thp,mmap,heap");
	cx_worker *w = calloc(1, sizeof(*w));
	if (w == NULL) {
		ucp_config_release(cfg);
		return UCS_ERR_NO_MEMORY;
	}
	w->efd = -1;
	w->wakefd = -1;

	ucp_params_t p;
	memset(&p, 0, sizeof(p));
	p.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
	p.features = UCP_FEATURE_RMA | UCP_FEATURE_AM | UCP_FEATURE_WAKEUP;
	p.mt_workers_shared = 0;
	st = ucp_init(&p, cfg, &w->ctx);
	ucp_config_release(cfg);
	if (st != UCS_OK) {
		free(w);
		return st;
	}

	ucp_worker_params_t wp;
	memset(&wp, 0, sizeof(wp));
	wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
	wp.thread_mode = UCS_THREAD_MODE_SINGLE;
	st = ucp_worker_create(w->ctx, &wp, &w->worker);
	if (st != UCS_OK) {
		ucp_cleanup(w->ctx);
		free(w);
		return st;
	}
	st = ucp_worker_get_efd(w->worker, &w->efd);
	if (st != UCS_OK) {
		cx_close(w);
		return st;
	}
	w->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (w->wakefd < 0) {
		cx_close(w);
		return UCS_ERR_IO_ERROR;
	}
	ucp_am_handler_param_t hp;
	memset(&hp, 0, sizeof(hp));
	hp.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
			UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
	hp.flags = UCP_AM_FLAG_WHOLE_MSG;
	hp.arg = w;
	hp.id = CX_AM_GET_REQ;
	hp.cb = cx_on_get_req;
	st = ucp_worker_set_am_recv_handler(w->worker, &hp);
	if (st == UCS_OK) {
		hp.id = CX_AM_GET_REP;
		hp.cb = cx_on_get_rep;
		st = ucp_worker_set_am_recv_handler(w->worker, &hp);
	}
	if (st != UCS_OK) {
		cx_close(w);
		return st;
	}
	// Rendezvous replies are off: UCX 1.13 cannot cancel a rendezvous
	// receive, and force-closing an endpoint with one in flight trips an
	// assertion (ucp_ep.c: proto_reqs not empty) that aborts the process.
	w->eager_replies = 1;
	*out = w;
	return UCS_OK;
}

void cx_close(cx_worker *w) {
	if (w->wakefd >= 0) {
		close(w->wakefd);
	}
	if (w->worker != NULL) {
		ucp_worker_destroy(w->worker);
	}
	if (w->ctx != NULL) {
		ucp_cleanup(w->ctx);
	}
	while (w->refusals.replies != NULL) {
		cx_reply *rp = w->refusals.replies;
		w->refusals.replies = rp->next;
		free(rp);
	}
	free(w->regs);
	free(w->reg_gen);
	free(w->slots);
	free(w->free_slots);
	free(w);
}

ucs_status_t cx_address(cx_worker *w, void **addr, size_t *len) {
	return ucp_worker_get_address(w->worker, (ucp_address_t **)addr, len);
}

void cx_address_release(cx_worker *w, void *addr) {
	ucp_worker_release_address(w->worker, (ucp_address_t *)addr);
}

static void cx_ep_err_cb(void *arg, ucp_ep_h ep, ucs_status_t status) {
	cx_ep *e = arg;
	(void)ep;
	if (e->status == UCS_OK) {
		e->status = status;
	}
	e->w->ep_errors++;
}

ucs_status_t cx_ep_create(cx_worker *w, const void *addr, int err_peer, cx_ep *e) {
	ucp_ep_params_t p;
	memset(&p, 0, sizeof(p));
	p.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
	p.address = (const ucp_address_t *)addr;
	p.err_mode = UCP_ERR_HANDLING_MODE_NONE;
	if (err_peer) {
		p.err_mode = UCP_ERR_HANDLING_MODE_PEER;
		p.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLER;
		p.err_handler.cb = cx_ep_err_cb;
		p.err_handler.arg = e;
	}
	e->w = w;
	e->status = UCS_OK;
	return ucp_ep_create(w->worker, &p, &e->ep);
}

void *cx_ep_close(cx_worker *w, cx_ep *e, int force, ucs_status_t *st) {
	(void)w;
	ucp_request_param_t p;
	memset(&p, 0, sizeof(p));
	if (force) {
		p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
		p.flags = UCP_EP_CLOSE_FLAG_FORCE;
	}
	void *req = ucp_ep_close_nbx(e->ep, &p);
	e->ep = NULL;
	if (req == NULL) {
		*st = UCS_OK;
		return NULL;
	}
	if (UCS_PTR_IS_ERR(req)) {
		*st = UCS_PTR_STATUS(req);
		return NULL;
	}
	*st = UCS_INPROGRESS;
	return req;
}

ucs_status_t cx_req_poll(void *req) {
	ucs_status_t st = ucp_request_check_status(req);
	if (st != UCS_INPROGRESS) {
		ucp_request_free(req);
	}
	return st;
}

ucs_status_t cx_mem_map(cx_worker *w, void *addr, size_t len, int allocate,
			ucp_mem_h *memh, void **addr_out, void **rkey, size_t *rkey_len) {
	ucp_mem_map_params_t p;
	memset(&p, 0, sizeof(p));
	p.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
		       UCP_MEM_MAP_PARAM_FIELD_FLAGS;
	p.address = allocate ? NULL : addr;
	p.length = len;
	p.flags = allocate ? UCP_MEM_MAP_ALLOCATE : 0;
	ucs_status_t st = ucp_mem_map(w->ctx, &p, memh);
	if (st != UCS_OK) {
		return st;
	}
	ucp_mem_attr_t a;
	memset(&a, 0, sizeof(a));
	a.field_mask = UCP_MEM_ATTR_FIELD_ADDRESS;
	st = ucp_mem_query(*memh, &a);
	if (st != UCS_OK) {
		ucp_mem_unmap(w->ctx, *memh);
		return st;
	}
	// For memory we pass in, the registration is that memory: UCX may
	// report a larger region containing it (memory inside a
	// UCP_MEM_MAP_ALLOCATE allocation reports the allocation's start).
	*addr_out = allocate ? a.address : addr;
	if (rkey == NULL) {
		return UCS_OK;
	}
	st = ucp_rkey_pack(w->ctx, *memh, rkey, rkey_len);
	if (st != UCS_OK) {
		ucp_mem_unmap(w->ctx, *memh);
		return st;
	}
	return UCS_OK;
}

ucs_status_t cx_mem_unmap(cx_worker *w, ucp_mem_h memh) {
	return ucp_mem_unmap(w->ctx, memh);
}

void cx_rkey_buffer_release(void *rkey) { ucp_rkey_buffer_release(rkey); }

ucs_status_t cx_rkey_unpack(cx_ep *e, const void *buf, ucp_rkey_h *out) {
	return ucp_ep_rkey_unpack(e->ep, buf, out);
}

void cx_rkey_destroy(ucp_rkey_h rkey) { ucp_rkey_destroy(rkey); }

int cx_rkey_local(ucp_rkey_h rkey, uint64_t raddr, void **ptr) {
	return ucp_rkey_ptr(rkey, raddr, ptr) == UCS_OK;
}

static void cx_get_cb(void *req, ucs_status_t status, void *user_data) {
	cx_batch *b = user_data;
	b->pending--;
	if (status != UCS_OK && b->status == UCS_OK) {
		b->status = status;
	}
	ucp_request_free(req);
}

int cx_post(cx_ep *e, cx_get *ops, int n, cx_batch *b) {
	cx_worker *w = e->w;
	ucp_request_param_t p;
	memset(&p, 0, sizeof(p));
	p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
	p.cb.send = cx_get_cb;
	p.user_data = b;
	ucp_request_param_t q;
	memset(&q, 0, sizeof(q));
	q.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_FLAGS;
	q.cb.send = cx_req_sent;
	q.flags = UCP_AM_SEND_FLAG_REPLY;
	for (int i = 0; i < n; i++) {
		cx_get *g = &ops[i];
		if (g->reg != 0) {
			uint32_t idx;
			if (!cx_slot_alloc(w, &idx)) {
				if (b->status == UCS_OK) {
					b->status = UCS_ERR_NO_MEMORY;
				}
				return i;
			}
			cx_slot *s = &w->slots[idx];
			s->state = 1;
			s->dst = g->local;
			s->len = g->len;
			s->b = b;
			b->pending++;
			g->hdr.slot = ((uint64_t)idx << 32) | s->gen;
			g->hdr.reg = g->reg;
			g->hdr.token = g->token;
			g->hdr.addr = g->remote;
			g->hdr.len = g->len;
			ucs_status_ptr_t r = ucp_am_send_nbx(e->ep, CX_AM_GET_REQ, &g->hdr,
							     sizeof(g->hdr), NULL, 0, &q);
			if (UCS_PTR_IS_ERR(r)) {
				cx_slot_done(w, idx, UCS_PTR_STATUS(r));
				return i;
			}
			continue;
		}
		ucs_status_ptr_t r = ucp_get_nbx(e->ep, (void *)(uintptr_t)g->local, g->len,
						 g->remote, (ucp_rkey_h)(uintptr_t)g->rkey, &p);
		if (r == NULL) {
			continue;
		}
		if (UCS_PTR_IS_ERR(r)) {
			if (b->status == UCS_OK) {
				b->status = UCS_PTR_STATUS(r);
			}
			return i;
		}
		b->pending++;
	}
	return n;
}

int cx_progress(cx_worker *w, int max) {
	int total = 0;
	for (int i = 0; i < max; i++) {
		unsigned n = ucp_worker_progress(w->worker);
		if (n == 0) {
			break;
		}
		total += (int)n;
	}
	return total;
}

int cx_wait(cx_worker *w, int timeout_ms) {
	ucs_status_t st = ucp_worker_arm(w->worker);
	if (st == UCS_ERR_BUSY) {
		return 0;
	}
	struct pollfd fds[2];
	fds[0].fd = w->efd;
	fds[0].events = POLLIN;
	fds[0].revents = 0;
	fds[1].fd = w->wakefd;
	fds[1].events = POLLIN;
	fds[1].revents = 0;
	int r = poll(fds, 2, timeout_ms);
	if (r > 0 && (fds[1].revents & POLLIN)) {
		uint64_t v;
		ssize_t rr = read(w->wakefd, &v, sizeof(v));
		(void)rr;
	}
	return 1;
}

void cx_wake(cx_worker *w) {
	uint64_t one = 1;
	ssize_t r = write(w->wakefd, &one, sizeof(one));
	(void)r;
}
