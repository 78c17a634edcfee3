package api

import "testing"

// TestNoticeSubjects: every notice subject carries its engine's member and
// id, and NoticeOf reads them back; anything else is not a notice.
func TestNoticeSubjects(t *testing.T) {
	for kind, s := range map[string]string{
		KindPullDone: PullDoneSubject("m1", "e1"), KindFreed: FreedSubject("m1", "e1"), KindResume: ResumeSubject("m1", "e1"),
		KindFenced: FencedSubject("m1", "e1"), KindHoldLost: HoldLostSubject("m1", "e1"),
	} {
		if want := Prefix + ".engine.m1.e1." + kind; s != want {
			t.Errorf("%s notice on %q, want %q", kind, s, want)
		}
		if m, e, k, ok := NoticeOf(s); !ok || m != "m1" || e != "e1" || k != kind {
			t.Errorf("NoticeOf(%q) = %q %q %q %v", s, m, e, k, ok)
		}
	}
	if got := EngineNotices("m1", "e1"); got != Prefix+".engine.m1.e1.>" {
		t.Errorf("EngineNotices = %q", got)
	}
	for _, s := range []string{
		Prefix + ".engine.e1.pull.done",    // no member (the subject before)
		Prefix + ".engine..e1.pull.done",   // empty member
		Prefix + ".engine.m1..pull.done",   // empty engine
		Prefix + ".engine.m1.e1.something", // no such kind
		Prefix + ".m1.e.e1.hold.create",    // an API subject
		"other.engine.m1.e1.pull.done",     // another prefix
	} {
		if m, e, k, ok := NoticeOf(s); ok {
			t.Errorf("NoticeOf(%q) = %q %q %q: not a notice", s, m, e, k)
		}
	}
}
