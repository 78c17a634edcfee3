package shim

// noticeCursor is where an engine stands in its connexd's notice journal
// (docs/api.md "Notices"): the last notice handled, per journal (a journal
// is one connexd run). It is the pure bookkeeping of notices.go — which
// live notice to hand on, which is a repeat, when some were missed and must
// be fetched first — with no clock, no NATS and no lock (the engine holds
// its own). It decides as the vLLM connector's notices.NoticeCursor does;
// both are checked against testdata/notice_cursor_cases.json.
type noticeCursor struct {
	journal string
	seq     uint64
}

// noticeVerdict is what a live notice calls for.
type noticeVerdict int

// Verdicts of Live, as the connector's notices.Verdict.
const (
	// verdictDeliver: the next one (or an unnumbered one): hand it on.
	verdictDeliver noticeVerdict = iota
	// verdictRepeat: already seen (a replay overlapped live delivery): drop it.
	verdictRepeat
	// verdictCatchUp: some before it were missed: fetch them
	// (engine.notices after Position), then hand it on if Seen says so.
	verdictCatchUp
)

// String is the verdict as the shared cases and the connector spell it.
func (v noticeVerdict) String() string {
	switch v {
	case verdictDeliver:
		return "deliver"
	case verdictRepeat:
		return "repeat"
	case verdictCatchUp:
		return "catch_up"
	}
	return "unknown"
}

// Live judges a live notice numbered seq in journal; the caller calls Seen
// once it handled it. Seq 0 is an unnumbered notice (a connexd that does
// not number them): always delivered, never recorded. A journal other
// than the cursor's means connexd restarted: the cursor moves to the new
// journal's start, whose earlier notices are news too.
func (c *noticeCursor) Live(journal string, seq uint64) noticeVerdict {
	if seq == 0 {
		return verdictDeliver
	}
	if journal != c.journal {
		c.journal, c.seq = journal, 0
	}
	switch {
	case seq <= c.seq:
		return verdictRepeat
	case seq == c.seq+1:
		return verdictDeliver
	}
	return verdictCatchUp
}

// Seen records a handled notice (live or replayed); false if it was
// already handled (a repeat), which the caller then drops. A journal other
// than the cursor's is adopted first, so Seen(journal, 0) only adopts it.
func (c *noticeCursor) Seen(journal string, seq uint64) bool {
	if journal != c.journal {
		c.journal, c.seq = journal, 0
	}
	if seq <= c.seq {
		return false
	}
	c.seq = seq
	return true
}

// Position is the last notice handled: its journal and sequence number.
func (c *noticeCursor) Position() (journal string, seq uint64) {
	return c.journal, c.seq
}

// Reset stands the cursor at (journal, seq): what came before is not news.
func (c *noticeCursor) Reset(journal string, seq uint64) {
	c.journal, c.seq = journal, seq
}

// Behind judges connexd's newest (journal, seq) for the engine, from an
// engine.register reply: true if notices are missing and must be fetched.
// A reply with no journal says nothing; a new journal with nothing in it
// yet is adopted at once (nothing to fetch).
func (c *noticeCursor) Behind(journal string, last uint64) bool {
	switch {
	case journal == "":
		return false
	case journal == c.journal:
		return last > c.seq
	case last == 0:
		c.journal, c.seq = journal, 0
		return false
	}
	return true
}
