package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/auth"
	"github.com/connex/connex/engine/shim"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// victimSetup is a prefill member p and a decode member d against a real
// nats-server process with authentication, a victim prefill engine engP
// holding KV the way the shims create holds (no consumer), and a victim
// decode engine engD running request r-victim on it.
type victimSetup struct {
	n       *securedNATS
	pre     *engine
	dec     *shim.Engine
	dcli    *api.Client
	hold    *messages.CreateHoldReply
	adminNC *nats.Conn
}

func startVictims(t *testing.T) *victimSetup {
	t.Helper()
	n := startSecuredNATS(t)
	for _, m := range []struct{ id, role string }{{"p", "prefill"}, {"d", "decode"}} {
		startConnexd(t, m.id, "--role", m.role, "--backend", "tcp", "--cluster-preset", "lan",
			"--nats-url", n.url, "--nats-creds", n.creds(t, "--role", "member", "--member", m.id))
	}
	v := &victimSetup{n: n}
	v.adminNC = n.connectAs(t, auth.Identity{Role: auth.RoleAdmin}, filepath.Join(n.authDir, auth.AdminCredsFile))
	_, pcli := n.engine(t, "p", "engP")
	v.pre, _ = newCreatedEngineAs(t, pcli, "engP", testLayout, true)
	dNC, _ := n.engine(t, "d", "engD")
	v.dec = openDecodeShim(t, dNC, "d", "engD")
	hold, err := pcli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: "engP", RegionId: v.pre.rid, BlockIds: []uint32{1, 2}, NumTokens: 32})
	if err != nil {
		t.Fatal(err)
	}
	v.hold = hold
	_, v.dcli = n.engine(t, "d", "engD")
	params := proto.Clone(hold.Params).(*messages.KVTransferParams)
	params.ConnexRequestId = "r-victim"
	if _, err := v.dcli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-victim", Params: params, PromptTokenIds: prompt(32), EngineId: "engD", ResumeAuthority: "router"}); err != nil {
		t.Fatal(err)
	}
	// request.start answered; its first renewal binds the hold to engD
	// right after. Once bound, another engine's renewal is refused.
	_, probe := n.engine(t, "p", "probe")
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		_, err := probe.Renew(ctx5(t), &messages.HoldRef{TransferId: hold.Params.TransferId})
		if api.CodeOf(err) == api.CodeNotYours {
			return nil
		}
		return fmt.Errorf("the hold is not bound to the request's engine yet (a renewal by another engine: %v)", err)
	})
	return v
}

// TestStolenRequestIDReadsNothing is issue 29's finding 1: an engine with
// valid credentials of its own and a victim's request id (a name, not a
// secret) tries to learn the victim's transfer id and blocks from errors,
// to pull the victim's KV into its own region, and to release the victim's
// hold. Holds are created as the shims create them (no consumer): connexd
// binds the hold to the request's engine at the decode leg. Every attempt
// is refused without naming the victim's transfer, blocks or owner, and the
// victim's pull and release still work.
func TestStolenRequestIDReadsNothing(t *testing.T) {
	v := startVictims(t)
	tid := v.hold.Params.TransferId
	evilNC, evil := v.n.engine(t, "d", "evilD")
	evilShim := openDecodeShim(t, evilNC, "d", "evilD")
	secrets := []string{tid, "engP"}

	// A takeover naming a wrong transfer: the error must not name the
	// request's transfer.
	wrong := proto.Clone(v.hold.Params).(*messages.KVTransferParams)
	wrong.TransferId = strings.Repeat("ab", 16)
	wrong.ConnexRequestId, wrong.ConnexResume = "r-victim", true
	_, err := evil.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-victim", Params: wrong, PromptTokenIds: prompt(32), EngineId: "evilD", Takeover: true, ResumeAuthority: "router"})
	if err == nil {
		t.Fatal("a takeover with a wrong transfer id succeeded")
	}
	noSecret(t, "request.start takeover with a wrong transfer id", err.Error(), secrets...)

	// Suppose the transfer id leaked anyway: the hold serves only the
	// request's engine. A pull with the right params fails, and one with
	// guessed block ids does not learn the hold's blocks.
	done, err := evilShim.Pull(ctx5(t), v.hold.Params, []uint32{5, 6})
	if done == nil || done.Ok || api.Code(done.ErrorCode) != api.CodeNotYours {
		t.Fatalf("the attacker's pull of the victim's hold: %v %v, want not_yours", done, err)
	}
	// (It names the transfer id the attacker gave, not the holder's blocks.)
	noSecret(t, "the attacker's pull", done.Error, "engP", "engD", "at the holder")
	guessed := proto.Clone(v.hold.Params).(*messages.KVTransferParams)
	guessed.RemoteBlockIds = []uint32{7, 8}
	done, err = evilShim.Pull(ctx5(t), guessed, []uint32{5, 6})
	if done == nil || done.Ok {
		t.Fatalf("the attacker's pull with guessed blocks: %v %v", done, err)
	}
	noSecret(t, "a pull with guessed blocks", done.Error, "engP", "engD", "at the holder", "lists 2 blocks")
	// On the holder's member, an engine of its own (evilP) may not
	// release, renew or inspect the victim's hold, naming the request or
	// not.
	_, evilP := v.n.engine(t, "p", "evilP")
	for _, q := range []struct {
		what string
		call func() error
	}{
		{"hold.release", func() error { _, err := evilP.Release(ctx5(t), &messages.HoldRef{TransferId: tid}); return err }},
		{"hold.release naming the request", func() error {
			_, err := evilP.Release(ctx5(t), &messages.HoldRef{TransferId: tid, RequestId: "r-victim"})
			return err
		}},
		{"hold.renew", func() error { _, err := evilP.Renew(ctx5(t), &messages.HoldRef{TransferId: tid}); return err }},
		{"hold.inspect", func() error { _, err := evilP.Inspect(ctx5(t), &messages.HoldRef{TransferId: tid}); return err }},
	} {
		err := q.call()
		wantCode(t, q.what+" of the victim's hold", err, api.CodeNotYours)
		noSecret(t, q.what, err.Error(), "engP", "engD")
	}
	// A takeover of the victim's request needs the router's word, even
	// with the right transfer id; an engine cannot give that word itself
	// (peer.grant is in the member scope).
	right := proto.Clone(v.hold.Params).(*messages.KVTransferParams)
	right.ConnexRequestId, right.ConnexResume = "r-victim", true
	_, err = evil.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-victim", Params: right, PromptTokenIds: prompt(32), EngineId: "evilD", Takeover: true, ResumeAuthority: "router"})
	wantCode(t, "a takeover with the right transfer id but no grant", err, api.CodeForbidden)
	short, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_, err = (&api.Client{NC: evilNC, Member: "d"}).GrantTakeover(short, &messages.StartRequestMsg{RequestId: "r-victim", EngineId: "evilD", Takeover: true})
	wantCode(t, "peer.grant from an engine", err, api.CodeForbidden)

	// A request of the attacker's own on the victim's transfer: its
	// connexd renews and releases the hold as the attacker, naming a
	// request whose state says so. The hold stays bound to the victim's
	// request (lease.Rebind keeps a binding to one request).
	own := proto.Clone(v.hold.Params).(*messages.KVTransferParams)
	own.ConnexRequestId = "r-evil"
	st, err := evil.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-evil", Params: own, PromptTokenIds: prompt(32), EngineId: "evilD", ResumeAuthority: "router"})
	if err != nil {
		t.Fatalf("the attacker's own request: %v", err)
	}
	epoch := st.State.Epoch
	done, _ = evilShim.Pull(ctx5(t), own, []uint32{5, 6})
	if done == nil || done.Ok || api.Code(done.ErrorCode) != api.CodeNotYours {
		t.Fatalf("the attacker's pull under a request of its own at epoch %d: %v, want not_yours", epoch, done)
	}
	if _, err := evil.FinishRequest(ctx5(t), &messages.FinishRequestMsg{RequestId: "r-evil", Epoch: epoch}); err != nil {
		t.Fatalf("the attacker's request.finish: %v", err)
	}
	if st, err := (&api.Client{NC: v.adminNC, Member: "p"}).Inspect(ctx5(t), &messages.HoldRef{TransferId: tid}); err != nil || st.State != "held" {
		t.Fatalf("the victim's hold after the attacker's own request finished: %v %v", st, err)
	}

	// The victim: its request is its own at epoch 1, its pull reads the
	// prefill engine's bytes, and it finishes, releasing the hold.
	admin := &api.Client{NC: v.adminNC, Member: "d"}
	req, err := admin.InspectRequest(ctx5(t), &messages.RequestRef{RequestId: "r-victim"})
	if err != nil || req.State.EngineId != "engD" || req.State.Epoch != 1 {
		t.Fatalf("the victim's request after the attacks: %v %v", req, err)
	}
	done, err = v.dec.Pull(ctx5(t), v.hold.Params, []uint32{3, 4})
	if err != nil || !done.Ok {
		t.Fatalf("the victim's pull: %v %v", done, err)
	}
	verifyBlocks(t, v.pre.region, v.dec.Region(), []uint32{1, 2}, []uint32{3, 4}, nil)
	if _, err := v.dcli.FinishRequest(ctx5(t), &messages.FinishRequestMsg{RequestId: "r-victim", Epoch: 1}); err != nil {
		t.Fatalf("the victim's request.finish: %v", err)
	}
	hs, err := (&api.Client{NC: v.adminNC, Member: "p"}).Inspect(ctx5(t), &messages.HoldRef{TransferId: tid})
	if err != nil || !hs.Freed || hs.State != "released" {
		t.Fatalf("the victim's hold after its request finished: %v %v", hs, err)
	}
}

// noSecret fails the test if text names any of secrets.
func noSecret(t *testing.T, what, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if strings.Contains(text, s) {
			t.Fatalf("%s: the answer names %q: %s", what, s, text)
		}
	}
	t.Logf("%s: refused without naming the victim's secrets: %s", what, text)
}

// TestEngineRepliesStayInItsInbox is issue 29's finding 4: connexd, a
// member allowed to publish anywhere, answered on whatever reply subject an
// engine set: another engine's request.fenced, the request bucket, the
// cluster's leave events. A call whose reply subject lies outside the
// calling engine's inbox is now dropped unanswered.
func TestEngineRepliesStayInItsInbox(t *testing.T) {
	v := startVictims(t)
	evilNC, _ := v.n.engine(t, "d", "evilD")
	kvSubject := "$KV.connex_requests.r-victim"
	targets := []string{
		api.FencedSubject("d", "engD"),         // another engine's notices
		kvSubject,                              // the request bucket
		"connex.cluster.connex.events.leave.d", // evict a member
		"_INBOX.e.d.engD.steal",                // another engine's inbox
	}
	var sniffers []*nats.Subscription
	for _, subj := range targets {
		s, err := v.adminNC.SubscribeSync(subj)
		if err != nil {
			t.Fatal(err)
		}
		sniffers = append(sniffers, s)
	}
	if err := v.adminNC.Flush(); err != nil {
		t.Fatal(err)
	}
	calls := []struct{ ep, body string }{
		{api.EpRequestInspect, `{"request_id":"r-victim"}`},
		{api.EpEngineState, `{}`},
		{api.EpRegionInspect, `{"region_id":"r0"}`},
	}
	for _, target := range targets {
		for _, c := range calls {
			m := nats.NewMsg(api.EngineSubject("d", "evilD", c.ep))
			m.Reply, m.Data = target, []byte(c.body)
			m.Header.Set(api.HeaderContentType, api.ContentJSON)
			if err := evilNC.PublishMsg(m); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The same calls with the engine's own inbox are answered: once they
	// are, the steered ones (sent first, on the same connection) would have
	// been answered too.
	for _, c := range calls {
		m := nats.NewMsg(api.EngineSubject("d", "evilD", c.ep))
		m.Data = []byte(c.body)
		m.Header.Set(api.HeaderContentType, api.ContentJSON)
		if _, err := evilNC.RequestMsg(m, 5*time.Second); err != nil {
			t.Fatalf("%s from the engine's own inbox: %v", c.ep, err)
		}
	}
	for i, s := range sniffers {
		if m, err := s.NextMsg(300 * time.Millisecond); err == nil {
			t.Fatalf("connexd answered an engine's call on %s: %s", targets[i], m.Data)
		}
	}
	// The victim is untouched: its request is running at epoch 1.
	req, err := (&api.Client{NC: v.adminNC, Member: "d"}).InspectRequest(ctx5(t), &messages.RequestRef{RequestId: "r-victim"})
	if err != nil || req.State.EngineId != "engD" || req.State.Epoch != 1 || req.Status != "running" {
		t.Fatalf("the victim's request after the steered replies: %v %v", req, err)
	}
}

// TestRogueEngineRefused is issue 29's finding 5 (and finding 11's first
// half): credentials minted for an engine on a decode member registered it
// as prefill, with any model and blocks_free = 2^31, and carried unlimited
// NATS limits. Now a member hosts only engines of its role, credentials
// carry the role and model an engine may register (checked through the
// NATS server, which verified them), advertised blocks are bounded by the
// engine's real regions, and an engine's connection has bounded limits.
func TestRogueEngineRefused(t *testing.T) {
	n := startSecuredNATS(t)
	for _, m := range []struct{ id, role string }{{"d", "decode"}, {"x", "all"}} {
		startConnexd(t, m.id, "--role", m.role, "--backend", "tcp", "--cluster-preset", "lan",
			"--nats-url", n.url, "--nats-creds", n.creds(t, "--role", "member", "--member", m.id))
	}
	adminNC := n.connectAs(t, auth.Identity{Role: auth.RoleAdmin}, filepath.Join(n.authDir, auth.AdminCredsFile))
	engineAs := func(member, engine string, extra ...string) (*nats.Conn, *api.Client) {
		id := auth.Identity{Role: auth.RoleEngine, Member: member, Engine: engine}
		nc := n.connectAs(t, id, n.creds(t, append([]string{"--role", "engine", "--member", member, "--engine", engine}, extra...)...))
		return nc, &api.Client{NC: nc, Member: member, Engine: engine}
	}
	register := func(cli *api.Client, role, model string, free, total uint32) error {
		_, err := cli.RegisterEngine(ctx5(t), &messages.RegisterEngineRequest{Engine: &messages.EngineInfo{
			EngineId: cli.Engine, Role: role, Model: model, BaseUrl: "http://127.0.0.1:9", BlocksFree: free, BlocksTotal: total, InstanceId: "i1",
		}, TtlMs: 60000})
		return err
	}

	// Credentials without a role (as minted before): the decode member
	// still hosts no prefill engine.
	_, plain := engineAs("d", "rogue")
	wantCode(t, "a prefill registration on a decode member", register(plain, "prefill", "m", 1<<31, 1<<31), api.CodeForbidden)
	// Credentials for a decode engine of model m, on a member of role all:
	// neither prefill nor another model.
	rogueNC, rogue := engineAs("x", "rogue", "--engine-role", "decode", "--model", "m")
	wantCode(t, "a prefill registration with decode credentials", register(rogue, "prefill", "m", 8, 8), api.CodeForbidden)
	wantCode(t, "a registration of another model", register(rogue, "decode", "M", 8, 8), api.CodeForbidden)

	// What they allow is accepted, with the blocks it has: its region's.
	if _, err := rogue.CreateRegion(ctx5(t), &messages.CreateRegionRequest{RegionId: "r0", Layout: (&engine{}).layoutProto()}); err != nil {
		t.Fatal(err)
	}
	if err := register(rogue, "decode", "m", 1<<31, 1<<31); err != nil {
		t.Fatalf("a registration its credentials allow: %v", err)
	}
	hb, err := adminNC.SubscribeSync("connex.cluster.>")
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
		m, err := hb.NextMsg(2 * time.Second)
		if err != nil {
			return err
		}
		var a messages.MemberAnnounce
		if err := proto.Unmarshal(m.Data, &a); err != nil {
			return fmt.Errorf("%s: %w", m.Subject, err)
		}
		for _, e := range a.Engines {
			if e.EngineId == "rogue" {
				if e.BlocksFree > testLayout.Blocks || e.BlocksTotal > testLayout.Blocks {
					t.Fatalf("advertised %d free of %d blocks; its region has %d", e.BlocksFree, e.BlocksTotal, testLayout.Blocks)
				}
				return nil
			}
		}
		return fmt.Errorf("x does not advertise rogue yet")
	})

	// Bounded NATS limits: the payload the server allows it, and its
	// subscriptions.
	if mp := rogueNC.MaxPayload(); mp != auth.EngineLimits.Payload {
		t.Fatalf("the engine's max payload is %d, want %d", mp, auth.EngineLimits.Payload)
	}
	for i := 0; i <= int(auth.EngineLimits.Subs); i++ {
		if _, err := rogueNC.SubscribeSync(fmt.Sprintf("_INBOX.e.x.rogue.s%d", i)); err != nil {
			break
		}
	}
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		_ = rogueNC.Flush()
		if le := rogueNC.LastError(); le != nil && strings.Contains(strings.ToLower(le.Error()), "maximum subscriptions") {
			return nil
		}
		return fmt.Errorf("no subscription limit yet (last error %v)", rogueNC.LastError())
	})
}
