// The fault guard: a SIGBUS handler that survives copies from or into file
// mappings whose file shrank (see faultguard.go). Async-signal-safe: the
// handler reads only the tables below, with atomics, and makes one mmap(2).
#ifndef CONNEX_FAULTGUARD_H
#define CONNEX_FAULTGUARD_H

#include <stddef.h>
#include <stdint.h>

// CX_ERR_FAULT is the status of a checked GET reply refused because the
// holder's memory faulted; outside UCX's own range of ucs_status_t.
#define CX_ERR_FAULT (-101)

// cx_fg_install installs the handler once; it returns 0, or errno.
int cx_fg_install(void);
// cx_fg_add watches [base, base+len); it returns the slot (>= 0) or -1
// when the table is full. Callers serialise add and del.
int cx_fg_add(uintptr_t base, size_t len);
void cx_fg_del(int slot);
// cx_fg_broken reports whether a fault hit the range of slot.
int cx_fg_broken(int slot);
// cx_fg_broken_at reports whether a watched range overlapping [p, p+n)
// is broken.
int cx_fg_broken_at(uintptr_t p, size_t n);
// cx_fg_count is the number of faults the handler survived so far.
uint64_t cx_fg_count(void);
// cx_fg_hit reports whether a fault counted since `since` lay in
// [p, p+n), or may have (faults too many to tell, or one still being
// recorded).
int cx_fg_hit(uint64_t since, uintptr_t p, size_t n);
// cx_fg_touch reads one byte of every page of [p, p+n), so that a page
// beyond its file's end faults now, under the guard, rather than inside
// UCX. It returns 1 when [p, p+n) faulted (now or before), else 0.
int cx_fg_touch(const void *p, size_t n);

#endif
