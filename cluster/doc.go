// Package cluster knows who is alive: a NATS-backed protoactor-go
// ClusterProvider with memberlist-style failure detection, and a Membership
// view (members by role, their load, join/leave events) for the daemon.
//
// # Design
//
// The decisions live in a pure state machine (view.go): events in —
// heartbeat(member, now), probe answered / failed, leave, dead notice,
// protoactor hint, tick(now) — and effects out: joined / left / suspect /
// alive events, probes to send, notices to publish. It reads no clock and
// does no I/O, and is tested with scripts against a fake clock. The
// Provider (provider.go, provider_loop.go) only wires NATS subscriptions,
// one timer and protoactor's MemberList to it, from a single goroutine.
//
// Sightings (sightings.go) is the second pure part, on the subscriber's
// side: fed the events by member name with now passed in, it remembers who
// left and when, and since when each member has been in view, so that a
// caller deciding orphans can tell "gone" from "not heard of yet"
// (Roster). The daemon wires it to Subscribe and the clock.
//
// # Subjects and payloads
//
// With prefix P (Config.SubjectPrefix, default "connex.cluster") and the
// protoactor cluster name C (which must be one NATS token):
//
//	P.C.events.heartbeat.<id>  messages.MemberAnnounce  every HeartbeatInterval ± jitter (idle: IdleHeartbeatInterval)
//	P.C.events.leave.<id>      messages.MemberGone      graceful leave, once
//	P.C.events.dead.<id>       messages.MemberGone      a peer found <id> dead, or tells a zombie so
//	P.C.ping.<id>              empty request → MemberAnnounce reply (after a graceful
//	                           leave: an empty reply, header Connex-Member-State: left)
//
// <id> is the protoactor ActorSystem id. A MemberAnnounce is the whole
// record (host:port of the protoactor remote, role, kinds, load, seq), so
// one message is enough to join. Payloads are protobuf
// (messages/membership.proto). A member subscribes to its ping subject
// before it first announces itself, then to P.C.events.>, and announces.
// Whoever sees an unknown member answers with its own heartbeat at once,
// so a newcomer learns the cluster in one round trip. A client
// (StartClient) only listens and learns the members within one interval.
//
// # Failure detection
//
//   - Silence of SuspectAfter() (SuspectMult heartbeats) makes a member
//     suspect: EventSuspect, and a probe on its ping subject (then one per
//     HeartbeatInterval after the previous probe ended). A member whose
//     own recent heartbeats came late (it is CPU-starved) gets SuspectMult
//     of its own longest recent gaps (the last 16), at most TTL/2.
//   - A member with no work in hand for a TTL (Config.Activity, and its
//     load zero) beats at IdleHeartbeatInterval, and every heartbeat says
//     which interval its sender keeps. Peers suspect it after SuspectMult
//     of the interval it announced where that is longer than their own
//     (never past TTL/2), and forget the gaps it kept at another interval
//     when it switches. Activity.Touch brings the full rate back at once.
//   - Silence is what this process could hear: the time its own loop woke
//     past its deadline (it was descheduled, CPU-starved, in a GC pause)
//     is its own lag and is not counted against anyone, and heartbeats
//     queued while it was late are applied before it judges. A starved
//     observer therefore suspects and removes the silent only after
//     SuspectAfter and the TTL of its own awake time.
//   - Likewise the bus: every member hears its own heartbeat back. While
//     that echo is overdue (one jittered interval of its own current
//     interval and half an interval after the last), NATS — or the process hosting it, CPU-starved — is
//     delivering nothing, and that time is not counted as anyone's silence
//     either. A client, which sends no heartbeats, keeps the plain rule.
//   - Suspicion is a hint: a suspect stays in the view and in protoactor's
//     topology, and the router sends it a leg only when no unsuspected
//     engine qualifies.
//   - A probe answered clears the suspicion (EventAlive).
//   - A probe answered "left" (the member announced its graceful leave and
//     is stopping; the probe overtook the notice) removes it at once as a
//     leave (ReasonLeave).
//   - A probe that NATS answers with "no responders" means the member's
//     NATS connection is gone — a crashed or SIGKILLed process — and it is
//     removed at once (ReasonUnreachable).
//   - A probe that times out proves nothing (a hung or SIGSTOPped process
//     keeps its subscriptions); the member is removed when it has been
//     silent for the TTL (ReasonTimeout).
//   - protoactor's remote.EndpointTerminatedEvent (its gRPC stream to a
//     member broke, which a SIGKILL causes at once) is a hint: the member is
//     suspected and probed immediately instead of after the silence.
//   - Whoever removes a member by its own finding publishes a dead notice,
//     and the others remove it too (ReasonReported): views converge and
//     protoactor's block lists agree.
//   - While our own NATS link is down we do not time anyone out, and when it
//     returns everyone's silence timer restarts. The others, meanwhile, may
//     have found us unreachable: a member whose NATS link drops is treated
//     as crashed, and on reconnect learns of its eviction.
//
// With DefaultLocalConfig (50 ms heartbeats, suspect after 100 ms, TTL 1 s)
// on a 2-core machine, 3 members in one process, 12 fresh runs of
// `go test -run TestProvider -v`, as seen by each survivor: a killed member
// (NATS connection and gRPC server gone) is removed after p50 1.8 ms / p99
// 3.4 ms (the hint); one that only loses NATS after p50 70 ms / p99 124 ms
// (silence and probe); a hung one after p50 981 ms / p99 1003 ms from the
// hang (the TTL, counted from its last heartbeat); a graceful leave is seen
// after p50 2 ms / p99 5 ms. On every join and leave the provider calls
// MemberList.UpdateClusterTopology with the live set, as protoactor's own
// providers do.
//
// # protoactor-go defects this package avoids
//
//   - Removed member ids are blocked for good (MemberList blocks every id
//     that leaves the topology). The provider keeps tombstones for removed
//     ids too, so its Membership never readmits what protoactor blocks; a
//     removed member that is still talking (a zombie back from a pause) is
//     sent a dead notice and gets EventSelfEvicted. It must restart with a
//     new ActorSystem — whose id is fresh — and a new Provider. Never give
//     a member a fixed id.
//   - Cluster.Shutdown panics on a client and calls the provider's Shutdown
//     only when graceful, after it has already stopped the ActorSystem. The
//     daemon calls Provider.Shutdown(graceful) itself first, so the leave
//     is announced while the member still serves; Shutdown is idempotent.
//     On a client it then stops the ActorSystem and Remote directly.
//   - Cluster.StartMember sleeps 1 s after the provider joined (and panics
//     where it fails); a graceful Cluster.Shutdown sleeps 2 s after it has
//     stopped the actor system, while the others have learnt of the leave
//     over NATS. StartMember returns once the provider joined (the error,
//     not a panic, where it failed) and StopMember is that shutdown without
//     the sleep.
//   - protoactor's remote server indexes a MessageBatch's target, sender
//     and type tables unchecked and two RPCs are panic("implement me");
//     gRPC does not recover handler panics, so one message from anyone who
//     reaches the port killed the process. NewRemoteConfig checks every
//     batch and recovers handler panics, ending only that stream, and with
//     RemoteOptions' TLS configs makes server and dialler speak TLS.
//   - remote.Config.MaxRetryCount defaults to 5 dials with a 2 s sleep after
//     each failure; NewRemoteConfig sets 1 (0 would be taken as connected).
//   - remote.Config.EndpointWriterQueueSize defaults to 1,000,000: 16 MB of
//     pointer slots per peer connection, scanned by every GC cycle. On two
//     cores that stalled whole processes for 0.5–0.8 s and made members time
//     each other out; NewRemoteConfig starts the (growable) queue at 1024.
//   - MemberList.UpdateClusterTopology runs protoactor's event-stream
//     handlers inline on the provider's goroutine; a call over 50 ms is
//     logged as a warning, since it delays detection.
//   - protoactor's gossip blocks members whose gossip heartbeat is older
//     than Config.HeartbeatExpiration (20 s default); the provider warns if
//     that is not longer than our TTL, and removes members protoactor
//     blocked on its own (ReasonBlocked) so both views stay equal.
//   - protoactor registers "cluster.proto" in the global protobuf registry,
//     so our wire file is messages/membership.proto.
//   - protoactor's code trips the race detector: tests that start clusters
//     skip under -race; the state machine and helpers are race-tested.
//
// # Wiring (daemon)
//
//	nc, _ := nats.Connect(url)
//	cfg := cluster.DefaultLANConfig() // or DefaultLocalConfig on one box
//	cfg.Role = cluster.RoleDecode
//	prov, _ := cluster.NewProvider(nc, cfg)
//	sys := actor.NewActorSystem()
//	c := actorcluster.New(sys, cluster.ActorClusterConfig(name, prov, lookup,
//		cluster.NewRemoteConfig(host, port, ro), actorcluster.WithKinds(kinds...)))
//	_ = cluster.StartMember(c, prov) // calls prov.StartMember
//	cancel := prov.Subscribe(onEvent) // replays live members, then changes
//	prov.SetLoad(inFlight)          // whenever it changes
//	...
//	cancel()
//	cluster.StopMember(c, prov)     // announce the leave, then stop
//	nc.Close()
package cluster
