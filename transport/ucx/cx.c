//go:build ucx && cgo

#include "cx.h"
#include "faultguard.h"

#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

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

void cx_abandon(cx_worker *w) {
	// The worker, its context and every table UCX may still reach stay
	// allocated; only this package's own wake-up descriptor goes.
	if (w->wakefd >= 0) {
		close(w->wakefd);
		w->wakefd = -1;
	}
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
			s->nonce = cx_nonce(w);
			s->dst = g->local;
			s->len = g->len;
			s->b = b;
			b->pending++;
			g->hdr.slot = ((uint64_t)idx << 32) | s->gen;
			g->hdr.nonce = s->nonce;
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
