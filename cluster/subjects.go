package cluster

import (
	"strings"

	"github.com/connex/connex/natssubject"
)

// subjects names the NATS subjects of one cluster:
//
//	<prefix>.<cluster>.events.heartbeat.<id>  MemberAnnounce, every interval
//	<prefix>.<cluster>.events.leave.<id>      MemberGone, graceful leave
//	<prefix>.<cluster>.events.dead.<id>       MemberGone, found dead by a peer
//	<prefix>.<cluster>.ping.<id>              request (empty) → MemberAnnounce,
//	                                          or an empty reply whose
//	                                          Connex-Member-State header is
//	                                          "left" after a graceful leave
type subjects struct{ base string }

// The probe reply's header, and its value, of a member that announced its
// graceful leave.
const (
	probeStateHeader = "Connex-Member-State"
	probeStateLeft   = "left"
)

// The third-from-last token of an events subject.
const (
	kindHeartbeat = "heartbeat"
	kindLeave     = "leave"
	kindDead      = "dead"
)

func newSubjects(prefix, clusterName string) subjects {
	return subjects{base: prefix + "." + clusterName}
}

func (s subjects) events() string             { return s.base + ".events.>" }
func (s subjects) heartbeat(id string) string { return s.base + ".events." + kindHeartbeat + "." + id }
func (s subjects) leave(id string) string     { return s.base + ".events." + kindLeave + "." + id }
func (s subjects) dead(id string) string      { return s.base + ".events." + kindDead + "." + id }
func (s subjects) ping(id string) string      { return s.base + ".ping." + id }

// parseEvent splits an events subject into its kind and member id.
func (s subjects) parseEvent(subj string) (kind, id string, ok bool) {
	rest, ok := strings.CutPrefix(subj, s.base+".events.")
	if !ok {
		return "", "", false
	}
	kind, id, ok = strings.Cut(rest, ".")
	if !ok || !natssubject.ValidToken(id) {
		return "", "", false
	}
	return kind, id, true
}
