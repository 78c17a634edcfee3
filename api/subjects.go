package api

import (
	"strings"

	"github.com/connex/connex/natssubject"
)

// Version is the subject API version; it is part of every subject.
const Version = "v1"

// Prefix starts every Connex subject.
const Prefix = "connex." + Version

// ServiceName is the NATS micro service name; `nats micro ls` lists it.
const ServiceName = "connex"

// Endpoint names, relative to a member's subject group connex.v1.<member>.
const (
	EpRegionRegister  = "region.register"  // RegisterRegionRequest -> RegionInfo
	EpRegionCreate    = "region.create"    // CreateRegionRequest -> RegionInfo
	EpRegionInspect   = "region.inspect"   // RegionRef -> RegionInfo
	EpEngineGone      = "engine.gone"      // EngineGoneRequest -> EngineGoneReply
	EpEngineRegister  = "engine.register"  // RegisterEngineRequest -> RegisterEngineReply
	EpEngineNotices   = "engine.notices"   // NoticesRequest -> NoticesReply (replay of missed notices)
	EpEngineState     = "engine.state"     // EngineStateRequest -> EngineState
	EpMemberStatus    = "member.status"    // MemberStatusRequest -> MemberStatus (connexd status)
	EpHoldCreate      = "hold.create"      // CreateHoldRequest -> CreateHoldReply
	EpHoldRenew       = "hold.renew"       // HoldRef -> HoldStatus
	EpHoldRelease     = "hold.release"     // HoldRef -> HoldStatus
	EpHoldInspect     = "hold.inspect"     // HoldRef -> HoldStatus
	EpPullStart       = "pull.start"       // StartPullRequest -> StartPullReply, then a PullDone notice
	EpPeerDescriptors = "peer.descriptors" // DescriptorsRequest -> Descriptors (member to member)
	EpPeerPullEnd     = "peer.pullend"     // PullEnd -> HoldStatus (member to member)
	EpRequestStart    = "request.start"    // StartRequestMsg -> RequestStatus
	EpRequestProgress = "request.progress" // RequestProgress -> RequestStatus
	EpRequestFinish   = "request.finish"   // FinishRequestMsg -> RequestStatus
	EpRequestInspect  = "request.inspect"  // RequestRef -> RequestStatus
	EpPeerAdopt       = "peer.adopt"       // AdoptRequestMsg -> RequestStatus (member to member)
	// EpPeerGrant: StartRequestMsg (request_id, engine_id) -> RequestStatus
	// (member to member): the router's word that engine_id may take the
	// request over (request.start with takeover) on this member.
	EpPeerGrant = "peer.grant"
)

// Notices to an engine go to connex.v1.engine.<member>.<engine>.<kind>:
// the engine's member is part of its address, as in its inbox
// (_INBOX.e.<member>.<engine>), so that engines of one id on two members
// (and their credentials) never read each other's.

// noticeSubject is the subject of notices of kind to engine on member.
func noticeSubject(member, engine, kind string) string {
	return Prefix + ".engine." + member + "." + engine + "." + kind
}

// ResumeSubject carries ResumeNotice for engine on member.
func ResumeSubject(member, engine string) string { return noticeSubject(member, engine, KindResume) }

// HoldLostSubject carries HoldLostNotice for engine on member.
func HoldLostSubject(member, engine string) string {
	return noticeSubject(member, engine, KindHoldLost)
}

// FencedSubject carries FencedNotice for engine on member.
func FencedSubject(member, engine string) string { return noticeSubject(member, engine, KindFenced) }

// EngineNotices is the wildcard subject of every notice to engine on
// member.
func EngineNotices(member, engine string) string { return noticeSubject(member, engine, ">") }

// Notice kinds: the tokens after connex.v1.engine.<member>.<engine>. of
// each notice subject (Notice.kind).
const (
	KindPullDone = "pull.done"
	KindFreed    = "blocks.freed"
	KindResume   = "request.resume"
	KindFenced   = "request.fenced"
	KindHoldLost = "hold.lost"
)

// NoticeOf splits a notice subject into its member, engine and kind; ok
// is false for any other subject.
func NoticeOf(subject string) (member, engine, kind string, ok bool) {
	rest, found := strings.CutPrefix(subject, Prefix+".engine.")
	if !found {
		return "", "", "", false
	}
	member, rest, found = strings.Cut(rest, ".")
	if !found || member == "" {
		return "", "", "", false
	}
	engine, kind, found = strings.Cut(rest, ".")
	switch kind {
	case KindPullDone, KindFreed, KindResume, KindFenced, KindHoldLost:
		return member, engine, kind, found && engine != ""
	}
	return "", "", "", false
}

// Notice headers: the sequence number of a live notice in its engine's
// journal, and the journal (see engine.notices).
const (
	HeaderNoticeSeq     = "Connex-Notice-Seq"
	HeaderNoticeJournal = "Connex-Notice-Journal"
)

// Subject is the full subject of endpoint ep on member, in the member
// scope: with authentication on, only members (and admins) may publish
// there; payload fields such as requester are then trusted, since a
// member calls on behalf of its engines.
func Subject(member, ep string) string { return Prefix + "." + member + "." + ep }

// EngineSubject is the subject of endpoint ep on member in engine's scope:
// connex.v1.<member>.e.<engine>.<ep>. The caller is engine: connexd takes
// the engine id from the subject (which the NATS server lets only that
// engine's credentials publish on) and refuses payload fields that name
// another engine (CodeForbidden).
func EngineSubject(member, engine, ep string) string {
	return Prefix + "." + member + ".e." + engine + "." + ep
}

// EngineScoped reports whether endpoint ep is served in the engine scope
// too (every endpoint except the peer ones and member.status).
func EngineScoped(ep string) bool {
	switch ep {
	case EpPeerDescriptors, EpPeerPullEnd, EpPeerAdopt, EpPeerGrant, EpMemberStatus:
		return false
	}
	return true
}

// FreedSubject carries BlocksFreed notices for engine on member.
func FreedSubject(member, engine string) string { return noticeSubject(member, engine, KindFreed) }

// PullDoneSubject carries PullDone notices for engine on member.
func PullDoneSubject(member, engine string) string {
	return noticeSubject(member, engine, KindPullDone)
}

// ValidToken reports whether s can be used as one subject token (member
// and engine ids); the rule is natssubject.ValidToken's, shared with auth and
// cluster.
func ValidToken(s string) bool { return natssubject.ValidToken(s) }
