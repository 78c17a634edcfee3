package activation

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"github.com/connex/connex/messages"
	"github.com/connex/connex/requests"
)

// TestScripts runs the interaction scripts in testdata/ with datadriven:
// each case is a command, a line "----", the expected output and a blank
// line; lines starting with # are comments. Each file starts with the
// clock at t=0. A request is r1 with transfer t1 held by member p1 unless
// a command says otherwise. Commands:
//
//	new self=m1 [refresh=6m]
//	advance 10s
//	start call=1 engine=e1 [takeover] [instance=i1] [transfer=t1] [retain=60] [prompt=3]
//	adopt call=1 dead=m0 engine=e2
//	progress call=2 epoch=1 [tokens=2]
//	takeover call=3 engine=e2 [instance=i2] [transfer=t1] [prompt=5]
//	grant call=1 engine=e2 [instance=i2] [ttl=2m]
//	finish call=4 epoch=1
//	engine-lost engine=e1 [instance=i1]
//	tick
//	inspect call=5
//	claimed ok=true|false
//	loaded owner=m1 epoch=1 engine=e1 rev=3 [transfer=t1] [tokens=2] | loaded err=notfound|down
//	written rev=2 | written err=fenced|down
//	renewed ok | renewed failed | renewed gone reason=expired
//	released
//	bind transfer=t1 requester=e2 request=r1 hold=e1/r1 [stored=e2/t1/3 | stored-err]
//
// Run with -rewrite (datadriven's flag) to regenerate the expected outputs
// after a deliberate change.
func TestScripts(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		s := &script{t0: t0, now: t0}
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			return s.run(t, d)
		})
	})
}

type script struct {
	t0, now time.Time
	a       *Activation
}

// errDown stands for a store or bus that did not answer.
var errDown = errors.New("store unavailable")

func (s *script) run(t *testing.T, d *datadriven.TestData) string {
	str := func(key, def string) string {
		v := def
		d.MaybeScanArgs(t, key, &v)
		return v
	}
	num := func(key string, def uint64) uint64 {
		v := def
		d.MaybeScanArgs(t, key, &v)
		return v
	}
	storeErr := func() error {
		switch str("err", "") {
		case "":
			return nil
		case "notfound":
			return fmt.Errorf("get r1: %w", requests.ErrNotFound)
		case "fenced":
			return fmt.Errorf("update r1: %w", requests.ErrFenced)
		case "down":
			return errDown
		}
		d.Fatalf(t, "err=%s: want notfound, fenced or down", str("err", ""))
		return nil
	}
	startMsg := func() *messages.StartRequestMsg {
		return &messages.StartRequestMsg{
			RequestId: str("id", "r1"), EngineId: str("engine", "e1"), Takeover: d.HasArg("takeover"),
			PromptTokenIds: make([]uint32, num("prompt", 3)),
			Params: &messages.KVTransferParams{TransferId: str("transfer", "t1"), RetainS: uint32(num("retain", 60)),
				RemoteCtrl: &messages.RemoteCtrl{Member: str("holder", "p1")}},
		}
	}
	if d.Cmd == "bind" {
		return s.bind(t, d)
	}
	if d.Cmd != "new" && s.a == nil {
		d.Fatalf(t, "%s before new", d.Cmd)
	}
	now := s.now
	call := num("call", 0)
	var ev Event
	switch d.Cmd {
	case "new":
		s.a = New(str("self", "m1"))
		if r := str("refresh", ""); r != "" {
			every, err := time.ParseDuration(r)
			if err != nil {
				d.Fatalf(t, "new refresh=%s: %v", r, err)
			}
			s.a.RefreshPrompt(every)
		}
		return s.status(nil, nil)
	case "advance":
		dur, err := time.ParseDuration(d.CmdArgs[0].Key)
		if err != nil {
			d.Fatalf(t, "advance: %v", err)
		}
		s.now = s.now.Add(dur)
		return s.status(nil, nil)
	case "start":
		ev = Start{Now: now, Call: call, Msg: startMsg(), Instance: str("instance", "")}
	case "adopt":
		ev = Adopt{Now: now, Call: call, ID: str("id", "r1"), DeadOwner: str("dead", ""), Engine: str("engine", "")}
	case "progress":
		ev = Progress{Now: now, Call: call, Epoch: num("epoch", 0), Tokens: make([]uint32, num("tokens", 1))}
	case "takeover":
		ev = Takeover{Now: now, Call: call, Msg: startMsg(), Instance: str("instance", "")}
	case "grant":
		g := Grant{Now: now, Call: call, ID: str("id", "r1"), Engine: str("engine", ""), Instance: str("instance", "")}
		if v := str("ttl", ""); v != "" {
			ttl, err := time.ParseDuration(v)
			if err != nil {
				d.Fatalf(t, "grant ttl=%s: %v", v, err)
			}
			g.TTL = ttl
		}
		ev = g
	case "finish":
		ev = Finish{Now: now, Call: call, Epoch: num("epoch", 0)}
	case "engine-lost":
		ev = EngineLost{Now: now, Engine: str("engine", ""), Instance: str("instance", "")}
	case "tick":
		ev = RenewTick{Now: now}
	case "inspect":
		ev = Inspect{Now: now, Call: call}
	case "claimed":
		ok := true
		d.MaybeScanArgs(t, "ok", &ok)
		ev = Claimed{Now: now, OK: ok}
	case "loaded":
		e := Loaded{Now: now, Rev: num("rev", 0), Err: storeErr()}
		if e.Err == nil {
			// The record as the store's Head reads it (no prompt token
			// ids), or with old, a record written before the prompt split
			// (the prompt in it, no prompt key).
			st, err := requests.New(&messages.StartRequestMsg{RequestId: "r1", PromptTokenIds: make([]uint32, 3),
				Params: &messages.KVTransferParams{TransferId: str("transfer", "t1"), RetainS: 60, RemoteCtrl: &messages.RemoteCtrl{Member: "p1"}}}, "", now)
			if err != nil {
				d.Fatalf(t, "loaded: %v", err)
			}
			st.Owner, st.Epoch, st.EngineId, st.GeneratedTokenIds = str("owner", ""), num("epoch", 0), str("engine", ""), make([]uint32, num("tokens", 0))
			if d.HasArg("old") {
				st.PromptLen, st.PromptDigest, st.PromptKey = 0, nil, ""
			} else {
				st, _ = requests.SplitState(st)
			}
			e.State = st
		}
		ev = e
	case "written":
		ev = Written{Now: now, Rev: num("rev", 0), Err: storeErr()}
	case "renewed":
		switch {
		case d.HasArg("ok"):
			ev = Renewed{Now: now, Result: RenewOK}
		case d.HasArg("failed"):
			ev = Renewed{Now: now, Result: RenewFailed}
		case d.HasArg("gone"):
			ev = Renewed{Now: now, Result: RenewGone, Code: 404, Reason: str("reason", "expired")}
		default:
			d.Fatalf(t, "renewed ok|failed|gone")
		}
	case "released":
		ev = Released{Now: now}
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	fx, err := s.a.Step(ev)
	return s.status(fx, err)
}

// status prints effects, the error, and the activation's state.
func (s *script) status(fx []Effect, err error) string {
	var b strings.Builder
	for _, e := range fx {
		b.WriteString("effect: " + describe(e, s.t0) + "\n")
	}
	if err != nil {
		fmt.Fprintf(&b, "error: %v\n", err)
	}
	a := s.a
	fmt.Fprintf(&b, "t=%s phase=%s", s.now.Sub(s.t0), a.Phase())
	if st := a.State(); st != nil {
		fmt.Fprintf(&b, " owner=%s epoch=%d engine=%s rev=%d tokens=%d", st.Owner, st.Epoch, st.EngineId, a.rev, len(st.GeneratedTokenIds))
	}
	if a.Busy() {
		fmt.Fprintf(&b, " busy queued=%d", a.Queued())
	}
	if a.HoldLost() {
		b.WriteString(" hold-lost")
	}
	b.WriteString("\n")
	return b.String()
}

// describe is one effect as a script line.
func describe(e Effect, t0 time.Time) string {
	switch e := e.(type) {
	case Claim:
		return "claim id=" + e.ID
	case Load:
		if e.Whole {
			return "load id=" + e.ID + " whole"
		}
		return "load id=" + e.ID
	case Write:
		s := fmt.Sprintf("write %s id=%s rev=%d", e.Op, e.ID, e.Rev)
		if e.State != nil {
			s += fmt.Sprintf(" owner=%s epoch=%d engine=%s prompt=%d tokens=%d", e.State.Owner, e.State.Epoch, e.State.EngineId,
				requests.PromptLen(e.State), len(e.State.GeneratedTokenIds))
		}
		if e.Prompt {
			s += " +prompt" // the write stores the prompt too
		}
		return s
	case Renew:
		return fmt.Sprintf("renew holder=%s transfer=%s engine=%s request=%s", e.Hold.Holder, e.Hold.TransferID, e.Hold.Engine, e.Hold.RequestID)
	case Release:
		return fmt.Sprintf("release holder=%s transfer=%s engine=%s request=%s", e.Hold.Holder, e.Hold.TransferID, e.Hold.Engine, e.Hold.RequestID)
	case NoticeFenced:
		s := fmt.Sprintf("notice fenced engine=%s stale-epoch=%d new-owner=%q", e.Engine, e.StaleEpoch, e.NewOwner)
		if e.LookupOwner {
			s += " lookup-owner"
		}
		return s
	case NoticeHoldLost:
		return fmt.Sprintf("notice hold-lost engine=%s epoch=%d reason=%s", e.State.EngineId, e.State.Epoch, e.Reason)
	case NoticeResume:
		return fmt.Sprintf("notice resume engine=%s epoch=%d", e.State.EngineId, e.State.Epoch)
	case Reply:
		if e.Err != nil {
			return fmt.Sprintf("reply call=%d error: %v", e.Call, e.Err)
		}
		return fmt.Sprintf("reply call=%d %s epoch=%d", e.Call, e.Status, e.State.GetEpoch())
	case Arm:
		return "arm at=" + e.At.Sub(t0).String()
	case Stop:
		return fmt.Sprintf("stop %q", e.Reason)
	case Count:
		if e.From != "" {
			return fmt.Sprintf("count %s from=%s", e.What, e.From)
		}
		return "count " + e.What.String()
	}
	return fmt.Sprintf("unknown effect %T", e)
}

// bind runs the rebind rule: hold=consumer/request is the hold's binding,
// stored=engine/transfer/epoch the request's stored state.
func (s *script) bind(t *testing.T, d *datadriven.TestData) string {
	var transfer, requester, request, hold string
	d.ScanArgs(t, "transfer", &transfer)
	d.ScanArgs(t, "requester", &requester)
	d.MaybeScanArgs(t, "request", &request)
	d.MaybeScanArgs(t, "hold", &hold)
	c := BindCall{Transfer: transfer, Requester: requester, Request: request}
	if !c.Applies() {
		return "no rule: the call names no request\n"
	}
	consumer, bound, _ := strings.Cut(hold, "/")
	if c.Bound(consumer, bound) {
		return "bound already: no read, no rebind\n"
	}
	var st *messages.RequestState
	var err error
	var stored string
	d.MaybeScanArgs(t, "stored", &stored)
	if d.HasArg("stored-err") || stored == "" {
		err = errDown
	} else {
		parts := strings.Split(stored, "/")
		if len(parts) != 3 {
			d.Fatalf(t, "stored=engine/transfer/epoch")
		}
		var epoch uint64
		fmt.Sscan(parts[2], &epoch)
		st = &messages.RequestState{RequestId: request, EngineId: parts[0], Epoch: epoch, Params: &messages.KVTransferParams{TransferId: parts[1]}}
	}
	epoch, ok := c.Rebind(st, err)
	if !ok {
		return "read the state: no rebind\n"
	}
	return fmt.Sprintf("read the state: rebind consumer=%s request=%s epoch=%d\n", requester, request, epoch)
}
