// Package handover hands the memory of a region connexd created
// (region.create) to the engine that created it, whatever the engine's uid:
// connexd listens on a unix socket (SOCK_SEQPACKET; a path, or a name in
// Linux's abstract namespace written "@name") and sends the region's
// descriptor with SCM_RIGHTS to a caller that presents the one-use token
// region.create's answer gave the engine.
//
// Why a descriptor and not a path: the region is a memfd, an unnamed file
// or UCX shared memory, reachable by path only as /proc/<connexd pid>/fd/<n>,
// which the kernel lets only connexd's own uid (and root) open. Sharing
// connexd's uid would let the engine read connexd's member credentials and
// act as a member. A received descriptor maps like the file itself, needs
// no file-system permission and stays valid after connexd exits.
//
// Why a token: the socket is reachable by any local user who can connect
// to it (the abstract namespace has no permissions at all), so the socket
// proves nothing. The token (128 random bits) travels only in the
// region.create reply, which NATS delivers to the calling engine's own
// inbox; it names one engine's region, is compared in constant time, works
// once and expires after TokenTTL. The caller's SO_PEERCRED (pid, uid,
// gid) is logged with every handover and refusal.
//
// The protocol, one message each way: the caller sends
// "CONNEX-REGION/1 <engine_id> <region_id> <token>"; connexd answers "OK"
// with one descriptor, or "ERR <reason>" with none, and closes the
// connection. Receive is the Go caller; the vLLM connector's memory.py
// speaks the same protocol.
package handover
