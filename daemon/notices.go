package daemon

import (
	"context"
	"strconv"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// noticeJournalLimit is how many notices per engine connexd keeps for
// replay (engine.notices); they are also dropped after tombstone_s.
const noticeJournalLimit = 1024

// publish sends notice m to an engine: numbered in the engine's journal
// (kept for replay), with the sequence in its headers, in the encoding the
// engine registered for (JSON or protobuf). Subjects that are not engine
// notices are published as they are.
func (d *Daemon) publish(subject string, m proto.Message) {
	msg := nats.NewMsg(subject)
	isJSON := false
	if _, engine, kind, ok := api.NoticeOf(subject); ok && d.journal != nil {
		now := d.now()
		n := noticeOf(kind, m)
		n.UnixMs = now.UnixMilli()
		n.Seq = d.journal.Append(engine, n, now)
		msg.Header.Set(api.HeaderNoticeSeq, strconv.FormatUint(n.Seq, 10))
		msg.Header.Set(api.HeaderNoticeJournal, d.journalID)
		isJSON = d.engineAPI.wantsJSON(engine)
		if d.prom != nil {
			d.prom.notice(kind)
		}
	}
	data, err := api.Marshal(m, isJSON)
	if err != nil {
		d.log.Error("encode notice", "subject", subject, "err", err)
		return
	}
	msg.Data = data
	ct := api.ContentProtobuf
	if isJSON {
		ct = api.ContentJSON
	}
	msg.Header.Set(api.HeaderContentType, ct)
	if err := d.Bus.Conn.PublishMsg(msg); err != nil {
		d.log.Warn("publish notice", "subject", subject, "err", err)
	}
}

// noticeOf wraps notice m of kind for the journal.
func noticeOf(kind string, m proto.Message) *messages.Notice {
	n := &messages.Notice{Kind: kind}
	switch b := m.(type) {
	case *messages.PullDone:
		n.Body = &messages.Notice_PullDone{PullDone: b}
	case *messages.BlocksFreed:
		n.Body = &messages.Notice_BlocksFreed{BlocksFreed: b}
	case *messages.ResumeNotice:
		n.Body = &messages.Notice_Resume{Resume: b}
	case *messages.FencedNotice:
		n.Body = &messages.Notice_Fenced{Fenced: b}
	case *messages.HoldLostNotice:
		n.Body = &messages.Notice_HoldLost{HoldLost: b}
	}
	return n
}

// EngineNotices replays an engine's notices after a sequence number.
func (d *Daemon) EngineNotices(ctx context.Context, r *messages.NoticesRequest) (*messages.NoticesReply, error) {
	if err := acting(ctx, "engine_id", &r.EngineId); err != nil {
		return nil, err
	}
	if err := requireToken("engine_id", r.EngineId); err != nil {
		return nil, err
	}
	after := r.AfterSeq
	otherJournal := r.Journal != "" && r.Journal != d.journalID
	if otherJournal {
		after = 0 // another connexd's sequence: everything kept is news
	}
	limit := int(min(r.Max, noticeJournalLimit))
	if limit == 0 {
		limit = noticeJournalLimit
	}
	entries, last, gap := d.journal.Since(r.EngineId, after, limit, d.now())
	rep := &messages.NoticesReply{LastSeq: last, Journal: d.journalID, Gap: gap || (otherJournal && r.AfterSeq > 0)}
	for _, e := range entries {
		rep.Notices = append(rep.Notices, e.Body.(*messages.Notice))
	}
	if len(rep.Notices) > 0 && d.prom != nil {
		d.prom.replays.Inc()
	}
	return rep, nil
}
