package cluster

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/connex/connex/messages"

	"github.com/connex/connex/natssubject"
)

// wireVersion is the membership protocol version this code speaks.
const wireVersion = 1

// maxEngines bounds the engines one announce may carry.
const maxEngines = 64

func announceOf(m Member, seq uint64, now time.Time) *messages.MemberAnnounce {
	return &messages.MemberAnnounce{
		Version:    wireVersion,
		MemberId:   m.ID,
		Host:       m.Host,
		Port:       int32(m.Port),
		Role:       string(m.Role),
		Kinds:      m.Kinds,
		Name:       m.Name,
		Load:       m.Load,
		Engines:    m.Engines,
		Seq:        seq,
		SentUnixMs: now.UnixMilli(),

		HeartbeatIntervalMs: uint32(min(m.HeartbeatInterval.Milliseconds(), math.MaxUint32)),
	}
}

// memberOf checks an announce and turns it into a Member.
func memberOf(a *messages.MemberAnnounce) (Member, error) {
	switch {
	case a.GetVersion() != wireVersion:
		return Member{}, fmt.Errorf("announce version %d, want %d", a.GetVersion(), wireVersion)
	case !natssubject.ValidToken(a.GetMemberId()):
		return Member{}, fmt.Errorf("announce member id %q", a.GetMemberId())
	case a.GetHost() == "" || a.GetPort() <= 0 || a.GetPort() > 65535:
		return Member{}, fmt.Errorf("announce of %s: address %q:%d", a.GetMemberId(), a.GetHost(), a.GetPort())
	}
	if len(a.GetEngines()) > maxEngines {
		return Member{}, fmt.Errorf("announce of %s: %d engines (at most %d)", a.GetMemberId(), len(a.GetEngines()), maxEngines)
	}
	kinds := slices.Clone(a.GetKinds())
	slices.Sort(kinds)
	return Member{
		ID:    a.GetMemberId(),
		Host:  a.GetHost(),
		Port:  int(a.GetPort()),
		Role:  Role(a.GetRole()),
		Kinds: kinds,
		Load:  a.GetLoad(),
		Name:  a.GetName(),

		HeartbeatInterval: intervalOfMs(a.GetHeartbeatIntervalMs()),
		// Cloned again by Member.clone before it leaves the view.
		Engines: a.GetEngines(),
	}, nil
}

func goneOf(id, reporter string, reason Reason) *messages.MemberGone {
	return &messages.MemberGone{Version: wireVersion, MemberId: id, ReporterId: reporter, Reason: string(reason)}
}
