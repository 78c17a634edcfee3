package e2e

import (
	"context"
	"crypto/tls"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/remote"
	"github.com/connex/connex/auth"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// remoteAddr is the host:port of p's protoactor remote, read from its
// membership heartbeat as any member would see it.
func remoteAddr(t testing.TB, p *proc) string {
	t.Helper()
	nc := connect(t, p.natsURL)
	ch := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe("connex.cluster.*.events.heartbeat.*", ch)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case m := <-ch:
			var a messages.MemberAnnounce
			if proto.Unmarshal(m.Data, &a) == nil && a.GetName() == p.member {
				return net.JoinHostPort(a.GetHost(), strconv.Itoa(int(a.GetPort())))
			}
		case <-deadline:
			t.Fatalf("no heartbeat of %s within 10s", p.member)
		}
	}
}

// malformedBatch is the message that crashed connexd: an envelope whose
// target index is past the end of the batch's target table (protoactor
// indexes it unchecked in deserializeTarget).
func malformedBatch() *remote.RemoteMessage {
	return &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: &remote.MessageBatch{
		TypeNames: []string{"actor.PID"},
		Envelopes: []*remote.MessageEnvelope{{Target: 7, TypeId: 0}},
	}}}
}

// attackRemote dials addr with opts, sends the malformed batch on
// protoactor's Receive stream and calls ListProcesses (which protoactor
// implements as panic("implement me")). It returns what the caller saw of
// each: an error for both, whether the server refused the peer, recovered,
// or died.
func attackRemote(t testing.TB, addr string, opts ...grpc.DialOption) (streamErr, unaryErr error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cli := remote.NewRemotingClient(conn)
	stream, err := cli.Receive(ctx)
	if err == nil {
		if err = stream.Send(malformedBatch()); err == nil {
			// The server answers a batch with nothing: Recv returns when it
			// ends the stream (refused, recovered or dead).
			_, err = stream.Recv()
		}
	}
	streamErr = err
	_, unaryErr = cli.ListProcesses(ctx, &remote.ListProcessesRequest{})
	return streamErr, unaryErr
}

// checkServes fails the test unless p is alive and answers on NATS.
func checkServes(t testing.TB, p *proc) {
	t.Helper()
	nc := connect(t, p.natsURL)
	reply, err := nc.Request("$SRV.PING.connex", nil, 5*time.Second)
	if err != nil || !strings.Contains(string(reply.Data), `"name":"connex"`) {
		t.Fatalf("connexd %s does not serve after the attack: %v\n%s", p.member, err, p.logs())
	}
	if !p.running() {
		t.Fatalf("connexd %s died:\n%s", p.member, p.logs())
	}
}

// TestRemoteMalformedBatch is finding 3 of issue 29: protoactor's remote
// panicked on a batch whose envelope names a target past the end of its
// table, and gRPC does not recover handler panics, so one message from a
// local user with no credential killed connexd (and, on the router, the
// embedded NATS with it).
//
// With auth on (the default) the remote speaks mutual TLS with member
// certificates: a stranger, in plaintext or in TLS without a member's
// certificate, cannot complete the handshake; a member's malformed batch
// and a call that panics in protoactor are refused or recovered, ending
// only that stream. With cluster_tls=off the plaintext stranger reaches
// protoactor and is refused by the batch check. connexd serves after each.
func TestRemoteMalformedBatch(t *testing.T) {
	t.Run("default", func(t *testing.T) {
		p := startConnexd(t, "solo", "--backend", "tcp")
		addr := remoteAddr(t, p)
		plainStream, plainUnary := attackRemote(t, addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		noCert := credentials.NewTLS(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}) //nolint:gosec // the attacker's side
		tlsStream, tlsUnary := attackRemote(t, addr, grpc.WithTransportCredentials(noCert))
		for name, err := range map[string]error{"plaintext stream": plainStream, "plaintext unary": plainUnary, "TLS without certificate, stream": tlsStream, "TLS without certificate, unary": tlsUnary} {
			if c := status.Code(err); c != codes.Unavailable {
				t.Errorf("%s: %v (code %v), want the connection refused (Unavailable)", name, err, c)
			}
		}
		checkServes(t, p)

		// A member (valid member credentials from the authority) sends the
		// same: its stream is refused, the panicking call recovered.
		flags := credsFlags(t, p.natsURL, "--nats-creds", "--role", "member", "--member", "evil")
		creds, err := os.ReadFile(flags[1])
		if err != nil {
			t.Fatal(err)
		}
		_, client, err := auth.MemberTLS(creds)
		if err != nil {
			t.Fatal(err)
		}
		streamErr, unaryErr := attackRemote(t, addr, grpc.WithTransportCredentials(credentials.NewTLS(client)))
		if c := status.Code(streamErr); c != codes.InvalidArgument {
			t.Errorf("member's malformed batch: %v (code %v), want InvalidArgument", streamErr, c)
		}
		if c := status.Code(unaryErr); c != codes.Internal {
			t.Errorf("member's ListProcesses: %v (code %v), want Internal (recovered panic)", unaryErr, c)
		}
		checkServes(t, p)
	})
	t.Run("cluster_tls=off", func(t *testing.T) {
		p := startConnexd(t, "solo", "--backend", "tcp", "--cluster-tls", "off")
		streamErr, unaryErr := attackRemote(t, remoteAddr(t, p), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if c := status.Code(streamErr); c != codes.InvalidArgument {
			t.Errorf("malformed batch: %v (code %v), want InvalidArgument", streamErr, c)
		}
		if c := status.Code(unaryErr); c != codes.Internal {
			t.Errorf("ListProcesses: %v (code %v), want Internal (recovered panic)", unaryErr, c)
		}
		checkServes(t, p)
	})
}
