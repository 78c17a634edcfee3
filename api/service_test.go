package api

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/messages"
	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// startServer runs a NATS server for the test and returns two connections
// to it (a service's and a caller's).
func startServer(t *testing.T) (svc, cli *nats.Conn) {
	t.Helper()
	s, err := natsserver.NewServer(&natsserver.Options{Host: "127.0.0.1", Port: natsserver.RANDOM_PORT, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(s.Shutdown)
	conn := func() *nats.Conn {
		nc, err := nats.Connect(s.ClientURL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	return conn(), conn()
}

// descHandler is a Handler whose StartPull and Descriptors the tests set;
// its other endpoints are not called.
type descHandler struct {
	Handler
	startPull   func(context.Context, *messages.StartPullRequest) (*messages.StartPullReply, error)
	descriptors func(context.Context, *messages.DescriptorsRequest, Answer[*messages.Descriptors])
}

func (h *descHandler) StartPull(ctx context.Context, r *messages.StartPullRequest) (*messages.StartPullReply, error) {
	return h.startPull(ctx, r)
}

func (h *descHandler) Descriptors(ctx context.Context, r *messages.DescriptorsRequest, a Answer[*messages.Descriptors]) {
	h.descriptors(ctx, r, a)
}

func serve(t *testing.T, nc *nats.Conn, h Handler, timeout time.Duration) {
	t.Helper()
	// Two slots: a deferred request that did not give its slot back would
	// soon make the service answer CodeOverloaded.
	svc, err := Serve(nc, h, ServeOptions{Member: "m1", Version: "0.0.1", MaxRequestBytes: 1 << 20, MaxInFlight: 2, Timeout: timeout,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	if err := nc.Flush(); err != nil { // the subscriptions are in place
		t.Fatal(err)
	}
}

// TestDeferredEndpoint: peer.descriptors answers when its handler calls
// the Answer, from another goroutine, after the handler returned; only the
// first answer counts; an unanswered request gets a timeout; a panicking
// handler an internal error.
func TestDeferredEndpoint(t *testing.T) {
	snc, cnc := startServer(t)
	h := &descHandler{descriptors: func(_ context.Context, r *messages.DescriptorsRequest, answer Answer[*messages.Descriptors]) {
		switch r.PullId {
		case "later":
			returned := make(chan struct{})
			defer close(returned)
			go func() {
				<-returned // answered after the handler returned
				answer(&messages.Descriptors{TransferId: r.TransferId}, nil)
				answer(nil, Errorf(CodeInternal, "a second answer must be dropped"))
			}()
		case "refused":
			answer(nil, Errorf(CodeExpired, "gone"))
		case "never":
		case "panic":
			panic("boom")
		}
	}}
	serve(t, snc, h, 300*time.Millisecond)
	c := &Client{NC: cnc, Member: "m1"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := c.Descriptors(ctx, &messages.DescriptorsRequest{TransferId: "t1", PullId: "later"})
	if err != nil || d.TransferId != "t1" {
		t.Fatalf("later: %v %v", d, err)
	}
	if _, err := c.Descriptors(ctx, &messages.DescriptorsRequest{PullId: "refused"}); CodeOf(err) != CodeExpired {
		t.Fatalf("refused: %v", err)
	}
	if _, err := c.Descriptors(ctx, &messages.DescriptorsRequest{PullId: "never"}); CodeOf(err) != CodeTimeout || !strings.Contains(err.Error(), "not answered") {
		t.Fatalf("never answered: %v (code %d)", err, CodeOf(err))
	}
	if _, err := c.Descriptors(ctx, &messages.DescriptorsRequest{PullId: "panic"}); CodeOf(err) != CodeInternal {
		t.Fatalf("panic: %v", err)
	}
	// The service still answers: the slots of the requests above were
	// given back (a leaked slot would end in CodeOverloaded after
	// MaxInFlight of them).
	if _, err := c.Descriptors(ctx, &messages.DescriptorsRequest{TransferId: "t2", PullId: "later"}); err != nil {
		t.Fatal(err)
	}
}

// TestInlineEndpoint: pull.start is answered from the subscription's
// goroutine, errors and panics included, one request after another.
func TestInlineEndpoint(t *testing.T) {
	snc, cnc := startServer(t)
	h := &descHandler{startPull: func(_ context.Context, r *messages.StartPullRequest) (*messages.StartPullReply, error) {
		switch r.PullId {
		case "bad":
			return nil, Errorf(CodeBadRequest, "bad pull")
		case "panic":
			panic("boom")
		}
		return &messages.StartPullReply{PullId: r.PullId}, nil
	}}
	serve(t, snc, h, time.Second)
	c := &Client{NC: cnc, Member: "m1"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for i := range 3 {
		id := fmt.Sprint("p", i)
		if rep, err := c.StartPull(ctx, &messages.StartPullRequest{PullId: id}); err != nil || rep.PullId != id {
			t.Fatalf("%s: %v %v", id, rep, err)
		}
	}
	if _, err := c.StartPull(ctx, &messages.StartPullRequest{PullId: "bad"}); CodeOf(err) != CodeBadRequest {
		t.Fatalf("bad: %v", err)
	}
	if _, err := c.StartPull(ctx, &messages.StartPullRequest{PullId: "panic"}); CodeOf(err) != CodeInternal {
		t.Fatalf("panic: %v", err)
	}
	if _, err := c.StartPull(ctx, &messages.StartPullRequest{PullId: "after"}); err != nil {
		t.Fatalf("after a panic: %v", err)
	}
}

// TestServeDefaultsRequestBound: a service whose options leave
// MaxRequestBytes at 0 takes requests up to DefaultMaxRequestBytes and
// refuses larger ones with CodeTooLarge (not every request, as a bound of
// 0 bytes would).
func TestServeDefaultsRequestBound(t *testing.T) {
	snc, cnc := startServer(t)
	h := &descHandler{startPull: func(_ context.Context, r *messages.StartPullRequest) (*messages.StartPullReply, error) {
		return &messages.StartPullReply{PullId: r.PullId}, nil
	}}
	svc, err := Serve(snc, h, ServeOptions{Member: "m1", Version: "0.0.1", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	if err := snc.Flush(); err != nil {
		t.Fatal(err)
	}
	c := &Client{NC: cnc, Member: "m1"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if rep, err := c.StartPull(ctx, &messages.StartPullRequest{PullId: "small"}); err != nil || rep.PullId != "small" {
		t.Fatalf("a small request: %v %v", rep, err)
	}
	big := &messages.StartPullRequest{PullId: "big", BlockIds: make([]uint32, DefaultMaxRequestBytes/2)}
	for i := range big.BlockIds {
		big.BlockIds[i] = uint32(i) + 1<<20 // 3 bytes each as varints
	}
	if _, err := c.StartPull(ctx, big); CodeOf(err) != CodeTooLarge {
		t.Fatalf("a request over %d bytes: %v (code %d), want CodeTooLarge", DefaultMaxRequestBytes, err, CodeOf(err))
	}
}

// TestAsks: answers to posted requests arrive on C and decode as
// Client.Call's would; a member nobody serves answers no-responders
// (CodePeerUnavailable, nats.ErrNoResponders); after Close nothing
// arrives.
func TestAsks(t *testing.T) {
	snc, cnc := startServer(t)
	h := &descHandler{descriptors: func(_ context.Context, r *messages.DescriptorsRequest, answer Answer[*messages.Descriptors]) {
		if r.PullId == "refused" {
			answer(nil, Errorf(CodeExpired, "gone"))
			return
		}
		answer(&messages.Descriptors{TransferId: r.TransferId}, nil)
	}}
	serve(t, snc, h, time.Second)
	a, err := (&Client{NC: cnc, Member: "m1"}).NewAsks(EpPeerDescriptors)
	if err != nil {
		t.Fatal(err)
	}
	next := func() *nats.Msg {
		t.Helper()
		select {
		case m := <-a.C():
			return m
		case <-time.After(5 * time.Second):
			t.Fatal("no answer within 5s")
			return nil
		}
	}
	for _, id := range []string{"t1", "t2"} {
		if err := a.Post(&messages.DescriptorsRequest{TransferId: id, PullId: "p"}); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]bool{}
	for range 2 {
		d := new(messages.Descriptors)
		if err := a.Decode(next(), d); err != nil {
			t.Fatal(err)
		}
		got[d.TransferId] = true
	}
	if !got["t1"] || !got["t2"] {
		t.Fatalf("answers: %v", got)
	}
	if err := a.Post(&messages.DescriptorsRequest{PullId: "refused"}); err != nil {
		t.Fatal(err)
	}
	if err := a.Decode(next(), new(messages.Descriptors)); CodeOf(err) != CodeExpired {
		t.Fatalf("refused: %v", err)
	}
	a.Close()
	a.Close() // idempotent
	if err := a.Post(&messages.DescriptorsRequest{TransferId: "t3", PullId: "p"}); err != nil {
		t.Fatal(err)
	}
	// The service answers in order: once a later call's answer is here,
	// t3's would have been too.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := (&Client{NC: cnc, Member: "m1"}).Descriptors(ctx, &messages.DescriptorsRequest{TransferId: "t4", PullId: "p"}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-a.C():
		t.Fatalf("an answer after Close: %q", m.Data)
	default:
	}

	nobody, err := (&Client{NC: cnc, Member: "m2"}).NewAsks(EpPeerDescriptors)
	if err != nil {
		t.Fatal(err)
	}
	defer nobody.Close()
	if err := nobody.Post(&messages.DescriptorsRequest{TransferId: "t"}); err != nil {
		t.Fatal(err)
	}
	err = nobody.Decode(func() *nats.Msg {
		select {
		case m := <-nobody.C():
			return m
		case <-time.After(5 * time.Second):
			t.Fatal("no no-responders answer within 5s")
			return nil
		}
	}(), new(messages.Descriptors))
	if CodeOf(err) != CodePeerUnavailable || !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("no responders: %v", err)
	}
}

// A call the NATS link could not carry for now (reconnecting, its buffer
// full) is peer_unavailable, carrying the NATS error (callers that resend
// on it can), not an internal error; a closed connection is not (it never
// comes back).
func TestLinkDownIsPeerUnavailable(t *testing.T) {
	if !LinkDown(fmt.Errorf("publish: %w", nats.ErrReconnectBufExceeded)) || !LinkDown(nats.ErrConnectionReconnecting) {
		t.Fatal("a reconnecting link is not read as down")
	}
	_, cli := startServer(t)
	cli.Close()
	c := &Client{NC: cli, Member: "m1"}
	_, err := c.StartPull(context.Background(), &messages.StartPullRequest{PullId: "p1"})
	if err == nil || LinkDown(err) || CodeOf(err) == CodePeerUnavailable {
		t.Fatalf("a call over a closed connection: %v (code %v), want an error that is not peer_unavailable", err, CodeOf(err))
	}
}

// TestRepliesSayOnlyJSON: a protobuf call (no content type, or
// application/protobuf) is answered with a plain message, no header to
// parse; a JSON call with JSON that says so; both decode.
func TestRepliesSayOnlyJSON(t *testing.T) {
	snc, cnc := startServer(t)
	serve(t, snc, &descHandler{startPull: func(_ context.Context, r *messages.StartPullRequest) (*messages.StartPullReply, error) {
		return &messages.StartPullReply{PullId: r.PullId}, nil
	}}, time.Second)
	for _, ct := range []string{"", ContentProtobuf, ContentJSON} {
		in := &messages.StartPullRequest{PullId: "p-" + ct}
		data, err := Marshal(in, ct == ContentJSON)
		if err != nil {
			t.Fatal(err)
		}
		msg := nats.NewMsg(Subject("m1", EpPullStart))
		msg.Data = data
		if ct != "" {
			msg.Header.Set(HeaderContentType, ct)
		}
		reply, err := cnc.RequestMsg(msg, 5*time.Second)
		if err != nil {
			t.Fatalf("%q: %v", ct, err)
		}
		switch got := reply.Header.Get(HeaderContentType); {
		case ct == ContentJSON && got != ContentJSON:
			t.Fatalf("JSON call answered with content type %q", got)
		case ct != ContentJSON && len(reply.Header) != 0:
			t.Fatalf("protobuf call %q answered with headers %v", ct, reply.Header)
		}
		out := new(messages.StartPullReply)
		if err := decodeReply(EpPullStart, reply, out); err != nil || out.PullId != in.PullId {
			t.Fatalf("%q: reply %v %v", ct, out, err)
		}
	}
	// An empty protobuf reply is a message of no bytes and no headers: not
	// NATS's no-responders status (an empty message with a 503 header), to
	// a call or to an Asks.
	c := &Client{NC: cnc, Member: "m1"}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if rep, err := c.StartPull(ctx, &messages.StartPullRequest{}); err != nil || rep.PullId != "" {
		t.Fatalf("an empty reply through a call: %v %v", rep, err)
	}
	a, err := c.NewAsks(EpPullStart)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.Post(&messages.StartPullRequest{}); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-a.C():
		if len(m.Data) != 0 || len(m.Header) != 0 {
			t.Fatalf("an empty reply came as %q with headers %v", m.Data, m.Header)
		}
		if err := a.Decode(m, new(messages.StartPullReply)); err != nil {
			t.Fatalf("an empty reply through an Asks: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no answer within 5s")
	}
}
