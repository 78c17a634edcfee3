package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/auth"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

var (
	natsServerOnce sync.Once
	natsServerPath string
	natsServerErr  error
)

// natsServerBin builds the nats-server binary from the module cache (the
// version go.mod pins), once per test run.
func natsServerBin(t testing.TB) string {
	t.Helper()
	natsServerOnce.Do(func() {
		natsServerPath = filepath.Join(filepath.Dir(connexdBin), "nats-server")
		cmd := exec.Command("go", "build", "-o", natsServerPath, "github.com/nats-io/nats-server/v2")
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			natsServerErr = fmt.Errorf("go build nats-server: %v\n%s", err, out)
		}
	})
	if natsServerErr != nil {
		t.Fatal(natsServerErr)
	}
	return natsServerPath
}

// securedNATS is a nats-server OS process configured the way docs/security.md's
// "Security" section tells an operator to: `connexd auth init` prints the
// trust block, the operator adds listen and jetstream.
type securedNATS struct {
	url, authDir string
}

func startSecuredNATS(t *testing.T) *securedNATS {
	t.Helper()
	dir := t.TempDir()
	authDir := filepath.Join(dir, "auth")
	out, err := exec.Command(connexdBin, "auth", "init", "--dir", authDir).Output()
	if err != nil {
		t.Fatalf("connexd auth init: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	if err := os.WriteFile(filepath.Join(dir, "connex-trust.conf"), out, 0o600); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "nats.conf")
	text := fmt.Sprintf("listen: %s\njetstream { store_dir: %q }\ninclude connex-trust.conf\n", addr, filepath.Join(dir, "js"))
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := exec.Command(natsServerBin(t), "-c", conf)
	var logs strings.Builder
	srv.Stdout, srv.Stderr = &logs, &logs
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Process.Kill()
		_ = srv.Wait()
		if t.Failed() {
			t.Logf("nats-server log:\n%s", logs.String())
		}
	})
	n := &securedNATS{url: "nats://" + addr, authDir: authDir}
	admin := filepath.Join(authDir, auth.AdminCredsFile)
	checkFor(t, 20*time.Second, 20*time.Millisecond, func() error {
		nc, err := nats.Connect(n.url, nats.UserCredentials(admin))
		if err != nil {
			return err
		}
		nc.Close()
		return nil
	})
	return n
}

// creds mints credentials for id with `connexd auth creds`.
func (n *securedNATS) creds(t *testing.T, id ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "id.creds")
	args := append([]string{"auth", "creds", "--dir", n.authDir, "-o", path}, id...)
	if out, err := exec.Command(connexdBin, args...).CombinedOutput(); err != nil {
		t.Fatalf("connexd %v: %v\n%s", args, err, out)
	}
	return path
}

// connectAs connects with credentials and the inbox prefix of an identity.
func (n *securedNATS) connectAs(t *testing.T, id auth.Identity, creds string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(n.url, nats.UserCredentials(creds), nats.CustomInboxPrefix(id.InboxPrefix()), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatalf("connect as %s: %v", id.Name(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func (n *securedNATS) engine(t *testing.T, member, engine string) (*nats.Conn, *api.Client) {
	t.Helper()
	id := auth.Identity{Role: auth.RoleEngine, Member: member, Engine: engine}
	nc := n.connectAs(t, id, n.creds(t, "--role", "engine", "--member", member, "--engine", engine))
	return nc, &api.Client{NC: nc, Member: member, Engine: engine}
}

// refusedSubscription subscribes and fails the test unless the server
// refuses it (a permissions violation for that subject); the subscription
// is returned so that the test can check nothing reached it.
func refusedSubscription(t *testing.T, nc *nats.Conn, subject string) *nats.Subscription {
	t.Helper()
	sub, err := nc.SubscribeSync(subject)
	if err != nil {
		t.Fatal(err)
	}
	checkFor(t, 5*time.Second, 10*time.Millisecond, func() error {
		_ = nc.Flush()
		if le := nc.LastError(); errors.Is(le, nats.ErrPermissionViolation) && strings.Contains(le.Error(), `"`+subject+`"`) {
			return nil
		}
		return fmt.Errorf("no permissions violation for a subscription to %s yet (last error %v)", subject, nc.LastError())
	})
	return sub
}

func wantCode(t *testing.T, what string, err error, code api.Code) {
	t.Helper()
	if api.CodeOf(err) != code {
		t.Fatalf("%s: %v (code %d), want code %d", what, err, api.CodeOf(err), code)
	}
	t.Logf("refused as it should be: %s: %v", what, err)
}

// TestAttacksRefusedWithAuthentication runs a prefill and a decode connexd
// against a real nats-server process with authentication (the
// configuration `connexd auth init` prints), each with its own member
// credentials, and engines with their own: a victim prefill engine holds
// KV for a victim decode engine, and attacker engines with valid
// credentials of their own try what issue 13 found open. Each attempt is
// refused with a clear code (or by the NATS server itself), and the
// victim's hold, pull and request are untouched.
func TestAttacksRefusedWithAuthentication(t *testing.T) {
	n := startSecuredNATS(t)
	for _, m := range []struct{ id, role string }{{"p", "prefill"}, {"d", "decode"}} {
		startConnexd(t, m.id, "--role", m.role, "--backend", "tcp", "--cluster-preset", "lan",
			"--nats-url", n.url, "--nats-creds", n.creds(t, "--role", "member", "--member", m.id))
	}
	adminNC := n.connectAs(t, auth.Identity{Role: auth.RoleAdmin}, filepath.Join(n.authDir, auth.AdminCredsFile))
	admin := func(member string) *api.Client { return &api.Client{NC: adminNC, Member: member} }

	// The victims: engP on p, engD on d.
	_, pcli := n.engine(t, "p", "engP")
	pre, _ := newCreatedEngineAs(t, pcli, "engP", testLayout, true)
	dNC, _ := n.engine(t, "d", "engD")
	dec := openDecodeShim(t, dNC, "d", "engD")
	hold, err := pcli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: "engP", RegionId: pre.rid, BlockIds: []uint32{1, 2}, NumTokens: 32, Consumer: "engD"})
	if err != nil {
		t.Fatal(err)
	}
	tid := hold.Params.TransferId
	_, dcli := n.engine(t, "d", "engD")
	prompt32 := prompt(32)
	if _, err := dcli.StartRequest(ctx5(t), &messages.StartRequestMsg{RequestId: "r-victim", Params: hold.Params, PromptTokenIds: prompt32, EngineId: "engD"}); err != nil {
		t.Fatal(err)
	}

	// The attackers: evilP on p and evilD on d (valid engine credentials
	// of their own), and a member credential of another member, x.
	evilPNC, evilP := n.engine(t, "p", "evilP")
	evilDNC, evilD := n.engine(t, "d", "evilD")
	if _, err := nats.Connect(n.url); err == nil || !strings.Contains(err.Error(), "Authorization Violation") {
		t.Fatalf("a client without credentials: %v, want an authorization violation", err)
	}

	// Watch everything the attackers might reach.
	sniffNotices := refusedSubscription(t, evilPNC, api.EngineNotices("d", "engD")) // engD's notices
	// A credential of the victim's engine id on another member (an id used
	// twice, or the file of an engine moved away) reads neither its notices
	// (a resume's carries the prompt) nor its replies.
	twinNC, _ := n.engine(t, "p", "engD")
	sniffTwin := refusedSubscription(t, twinNC, api.EngineNotices("d", "engD"))
	sniffTwinInbox := refusedSubscription(t, twinNC, auth.Identity{Role: auth.RoleEngine, Member: "d", Engine: "engD"}.InboxPrefix()+".>")
	sniffInbox := refusedSubscription(t, evilPNC, "_INBOX.>")                // every reply
	refusedSubscription(t, evilPNC, api.Subject("p", api.EpPeerDescriptors)) // answering for p
	xNC := n.connectAs(t, auth.Identity{Role: auth.RoleMember, Member: "x"}, n.creds(t, "--role", "member", "--member", "x"))
	answerFor := refusedSubscription(t, xNC, api.Subject("p", api.EpPeerDescriptors)) // member x answering for p

	// Spoofed identities on the engine's own scope: 406.
	_, err = evilP.Release(ctx5(t), &messages.HoldRef{TransferId: tid, Requester: "engD"})
	wantCode(t, "hold.release claiming to be the consumer", err, api.CodeForbidden)
	_, err = evilP.Release(ctx5(t), &messages.HoldRef{TransferId: tid})
	wantCode(t, "hold.release of a hold bound to another consumer", err, api.CodeNotYours)
	_, err = evilP.Renew(ctx5(t), &messages.HoldRef{TransferId: tid, Requester: "engP"})
	wantCode(t, "hold.renew claiming to be the holder", err, api.CodeForbidden)
	_, err = evilP.EngineGone(ctx5(t), &messages.EngineGoneRequest{EngineId: "engP"})
	wantCode(t, "engine.gone of another engine", err, api.CodeForbidden)
	_, err = evilP.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: "engP", RegionId: pre.rid, BlockIds: []uint32{1}, NumTokens: 16})
	wantCode(t, "hold.create on another engine's region", err, api.CodeForbidden)
	_, err = evilP.CreateRegion(ctx5(t), &messages.CreateRegionRequest{EngineId: "engD", RegionId: "r0", Layout: pre.layoutProto()})
	wantCode(t, "region.create as another engine", err, api.CodeForbidden)
	_, err = evilP.StartPull(ctx5(t), &messages.StartPullRequest{Params: hold.Params, EngineId: "engD", RegionId: "r0", BlockIds: []uint32{1, 2}})
	wantCode(t, "pull.start into another engine's region", err, api.CodeForbidden)
	_, err = evilP.EngineState(ctx5(t), &messages.EngineStateRequest{EngineId: "engD"})
	wantCode(t, "engine.state of another engine", err, api.CodeForbidden)
	_, err = evilP.EngineNotices(ctx5(t), &messages.NoticesRequest{EngineId: "engD"})
	wantCode(t, "engine.notices of another engine", err, api.CodeForbidden)
	_, err = evilD.Progress(ctx5(t), &messages.RequestProgress{RequestId: "r-victim", Epoch: 1, TokenIds: []uint32{666}})
	wantCode(t, "request.progress of another engine's request (epoch guessed)", err, api.CodeForbidden)
	_, err = evilD.FinishRequest(ctx5(t), &messages.FinishRequestMsg{RequestId: "r-victim", Epoch: 1})
	wantCode(t, "request.finish of another engine's request", err, api.CodeForbidden)
	_, err = evilD.InspectRequest(ctx5(t), &messages.RequestRef{RequestId: "r-victim"})
	wantCode(t, "request.inspect of another engine's request", err, api.CodeForbidden)

	// Outside the engine's own scope the NATS server drops the publish:
	// the client reports 406 from the server's permissions violation.
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	evilMember := &api.Client{NC: evilPNC, Member: "p"} // member scope, payload fields trusted there
	_, err = evilMember.Release(short(), &messages.HoldRef{TransferId: tid, Requester: "engD"})
	wantCode(t, "hold.release in the member scope (payload names the consumer)", err, api.CodeForbidden)
	_, err = evilMember.Descriptors(short(), &messages.DescriptorsRequest{TransferId: tid, Requester: "engD", PullId: "evil", Layout: pre.layoutProto(), TimeoutMs: 1000})
	wantCode(t, "peer.descriptors from an engine", err, api.CodeForbidden)
	_, err = (&api.Client{NC: evilDNC, Member: "d"}).Adopt(short(), &messages.AdoptRequestMsg{RequestId: "r-victim", DeadOwner: "d"})
	wantCode(t, "peer.adopt from an engine", err, api.CodeForbidden)
	_, err = (&api.Client{NC: evilPNC, Member: "d", Engine: "evilP"}).EngineState(short(), &messages.EngineStateRequest{})
	wantCode(t, "another member's API", err, api.CodeForbidden)
	if _, err := evilDNC.Request("$KV.connex_requests.r-victim", []byte("{}"), time.Second); err == nil {
		t.Fatal("an engine wrote the request bucket")
	}
	js, err := jetstream.New(evilDNC)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.KeyValue(short(), "connex_requests"); err == nil {
		t.Fatal("an engine reached the request bucket through the JetStream API")
	}

	// The victims are untouched: the hold is held and bound to engD, the
	// request is engD's at epoch 1 with its prompt, and engD's pull reads
	// engP's bytes (nobody else answered for p).
	st, err := admin("p").Inspect(ctx5(t), &messages.HoldRef{TransferId: tid})
	if err != nil || st.State != "held" || st.Freed {
		t.Fatalf("the victim's hold after the attacks: %v %v", st, err)
	}
	req, err := admin("d").InspectRequest(ctx5(t), &messages.RequestRef{RequestId: "r-victim"})
	if err != nil || req.State.EngineId != "engD" || req.State.Epoch != 1 || len(req.State.GeneratedTokenIds) != 0 || len(req.State.PromptTokenIds) != len(prompt32) {
		t.Fatalf("the victim's request after the attacks: %v %v", req, err)
	}
	done, err := dec.Pull(ctx5(t), hold.Params, []uint32{3, 4})
	if err != nil || !done.Ok {
		t.Fatalf("the victim's pull: %v %v", done, err)
	}
	verifyBlocks(t, pre.region, dec.Region(), []uint32{1, 2}, []uint32{3, 4}, nil)
	if _, err := dcli.FinishRequest(ctx5(t), &messages.FinishRequestMsg{RequestId: "r-victim", Epoch: 1}); err != nil {
		t.Fatalf("the victim's request.finish: %v", err)
	}
	for _, s := range []*nats.Subscription{sniffNotices, sniffInbox, answerFor, sniffTwin, sniffTwinInbox} {
		if m, err := s.NextMsg(50 * time.Millisecond); err == nil {
			t.Fatalf("a refused subscription to %s received %s", s.Subject, m.Subject)
		}
	}
}

// layoutProto is the engine region's layout on the wire.
func (e *engine) layoutProto() *messages.Layout {
	l := testLayout
	if e.region != nil {
		l = e.region.Layout
	}
	return &messages.Layout{NumLayers: l.Layers, KvPlanes: l.Planes, NumBlocks: l.Blocks, BlockBytes: l.BlockBytes, BlockSize: l.BlockSize, TpSize: l.TPSize}
}
