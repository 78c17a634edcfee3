//go:build ucx && cgo

#include "faultguard.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define FG_SLOTS 1024
#define FG_RING 64

// A slot is written under a sequence lock: seq is odd while a writer
// (cx_fg_add / cx_fg_del, serialised by the caller) changes it, so the
// handler never acts on a half-written range.
typedef struct {
	_Atomic uint64_t seq;
	_Atomic uintptr_t base;
	_Atomic uintptr_t len; // 0: free
	_Atomic int broken;
} fg_slot;

static fg_slot fg_slots[FG_SLOTS];
static _Atomic int fg_high;         // slots in use are below it
static _Atomic uint64_t fg_faults;  // faults survived
static _Atomic uintptr_t fg_addr[FG_RING];
static _Atomic uint64_t fg_seq[FG_RING]; // k+1 once fault k's address is in fg_addr
static struct sigaction fg_prev;
static _Atomic int fg_installed;
static uintptr_t fg_page = 4096;

static int fg_find(uintptr_t a, uintptr_t *base, uintptr_t *len) {
	int hi = atomic_load(&fg_high);
	for (int i = 0; i < hi; i++) {
		fg_slot *s = &fg_slots[i];
		uint64_t q = atomic_load(&s->seq);
		if (q & 1) {
			continue;
		}
		uintptr_t b = atomic_load(&s->base), l = atomic_load(&s->len);
		if (atomic_load(&s->seq) != q || l == 0) {
			continue;
		}
		if (a >= b && a - b < l) {
			*base = b;
			*len = l;
			return i;
		}
	}
	return -1;
}

static void fg_chain(int sig, siginfo_t *si, void *uc) {
	if (fg_prev.sa_flags & SA_SIGINFO) {
		fg_prev.sa_sigaction(sig, si, uc);
		return;
	}
	if (fg_prev.sa_handler == SIG_DFL || fg_prev.sa_handler == SIG_IGN) {
		// Returning re-executes the access, which faults again and
		// takes the default action (a core dump), as without us.
		signal(sig, SIG_DFL);
		return;
	}
	fg_prev.sa_handler(sig);
}

static void fg_handler(int sig, siginfo_t *si, void *uc) {
	// BUS_ADRERR: the page has no backing, i.e. it lies beyond the end of
	// the file it maps. Anything else (alignment, hardware errors) is not
	// ours to survive.
	if (si->si_code != BUS_ADRERR) {
		fg_chain(sig, si, uc);
		return;
	}
	int saved = errno;
	uintptr_t a = (uintptr_t)si->si_addr;
	uintptr_t base = a & ~(fg_page - 1), len = fg_page;
	int slot = fg_find(a, &base, &len);
	if (slot >= 0) {
		// The whole range: one fault per broken region, not one per page.
		uintptr_t end = (base + len + fg_page - 1) & ~(fg_page - 1);
		base &= ~(fg_page - 1);
		len = end - base;
	}
	void *m = mmap((void *)base, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
	errno = saved;
	if (m == MAP_FAILED) {
		fg_chain(sig, si, uc);
		return;
	}
	if (slot >= 0) {
		atomic_store(&fg_slots[slot].broken, 1);
	}
	uint64_t k = atomic_fetch_add(&fg_faults, 1);
	atomic_store(&fg_addr[k % FG_RING], a);
	atomic_store(&fg_seq[k % FG_RING], k + 1);
}

int cx_fg_install(void) {
	int expected = 0;
	if (!atomic_compare_exchange_strong(&fg_installed, &expected, 1)) {
		return 0;
	}
	long pg = sysconf(_SC_PAGESIZE);
	if (pg > 0) {
		fg_page = (uintptr_t)pg;
	}
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = fg_handler;
	// SA_ONSTACK: Go's threads run signal handlers on their signal stack.
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGBUS, &sa, &fg_prev) != 0) {
		atomic_store(&fg_installed, 0);
		return errno;
	}
	return 0;
}

int cx_fg_add(uintptr_t base, size_t len) {
	for (int i = 0; i < FG_SLOTS; i++) {
		fg_slot *s = &fg_slots[i];
		if (atomic_load(&s->len) != 0) {
			continue;
		}
		atomic_fetch_add(&s->seq, 1);
		atomic_store(&s->base, base);
		atomic_store(&s->broken, 0);
		atomic_store(&s->len, len);
		atomic_fetch_add(&s->seq, 1);
		if (i >= atomic_load(&fg_high)) {
			atomic_store(&fg_high, i + 1);
		}
		return i;
	}
	return -1;
}

void cx_fg_del(int slot) {
	if (slot < 0 || slot >= FG_SLOTS) {
		return;
	}
	fg_slot *s = &fg_slots[slot];
	atomic_fetch_add(&s->seq, 1);
	atomic_store(&s->len, 0);
	atomic_store(&s->broken, 0);
	atomic_fetch_add(&s->seq, 1);
}

int cx_fg_broken(int slot) {
	return slot >= 0 && slot < FG_SLOTS && atomic_load(&fg_slots[slot].broken);
}

int cx_fg_broken_at(uintptr_t p, size_t n) {
	int hi = atomic_load(&fg_high);
	for (int i = 0; i < hi; i++) {
		fg_slot *s = &fg_slots[i];
		if (!atomic_load(&s->broken)) {
			continue;
		}
		uintptr_t b = atomic_load(&s->base), l = atomic_load(&s->len);
		if (l != 0 && p < b + l && b < p + n) {
			return 1;
		}
	}
	return 0;
}

uint64_t cx_fg_count(void) { return atomic_load(&fg_faults); }

int cx_fg_hit(uint64_t since, uintptr_t p, size_t n) {
	uint64_t now = atomic_load(&fg_faults);
	if (now - since > FG_RING) {
		return 1;
	}
	for (uint64_t k = since; k < now; k++) {
		if (atomic_load(&fg_seq[k % FG_RING]) != k + 1) {
			return 1; // still being recorded, or already overwritten
		}
		uintptr_t a = atomic_load(&fg_addr[k % FG_RING]);
		if (a >= p && a - p < n) {
			return 1;
		}
	}
	return 0;
}

int cx_fg_touch(const void *p, size_t n) {
	if (n == 0) {
		return 0;
	}
	uintptr_t a = (uintptr_t)p;
	if (cx_fg_broken_at(a, n)) {
		return 1;
	}
	uint64_t before = cx_fg_count();
	const volatile unsigned char *b = p;
	for (size_t off = 0; off < n; off += fg_page) {
		(void)b[off];
	}
	(void)b[n - 1];
	if (cx_fg_count() != before && cx_fg_hit(before, a, n)) {
		return 1;
	}
	return cx_fg_broken_at(a, n);
}
