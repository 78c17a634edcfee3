// Package lease decides the life of one hold: the renewable lease on a
// request's prefill KV blocks.
//
// Hold is a pure state machine in the style of etcd's raft: events go in
// through Step with the current time, effects come out (deregister the
// memory, free the blocks to the engine), and the caller performs them. It
// never reads a clock, starts a goroutine or touches memory, so every race
// — a release during a pull, expiry during a pull, a renew after expiry — is
// a deterministic test in testdata/.
//
// Lifecycle:
//
//	            Renew / PullStart / PullEnd (renew the lease)
//	             ┌──────┐
//	             ▼      │
//	create ──► Held ────┘
//	             │ Release ─────────────► Releasing ──┐ last pull ends
//	             │ PullEnd ok (after_pull)─┘          │ (or its deadline passes)
//	             │ lease deadline ──────► Expiring ───┤
//	             │                                    ▼
//	             └── (no pull running) ─────────► Freed: Released | Expired | Pulled
//	 EngineGone from any live state ────────────► Freed: EngineGone
//	 Shutdown (daemon stops) from any live state ► Freed: ShutDown
//	 Abort (the owner stops) from any live state ─► Freed: Aborted
//
// The blocks are freed (Deregister then Free) exactly once, and never while
// a pull that started is still within its deadline, except when the hold
// ends under it (EngineGone, Shutdown, Abort). The hold also decides the
// read accounting: BeginRead when a pull starts, EndRead when it ends, is
// abandoned, or the hold ends under it.
package lease
