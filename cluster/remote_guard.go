package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"

	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// protoactor's remote server trusts what it reads: an envelope's target,
// sender and type are indexes into the batch's tables, used unchecked
// (deserializeTarget panics on an index past the end), its serializer id
// indexes a slice, and two unary RPCs are panic("implement me"). gRPC does
// not recover handler panics, so one such message killed the process.
// remoteGuard checks every batch before protoactor reads it, ends the
// stream of a peer that sends a bad one, and recovers any panic left in
// protoactor's handlers (a Terminated without a watchee, ...), ending only
// that stream or call.
type remoteGuard struct{ log *slog.Logger }

// errBadBatch is what a peer that sent a malformed batch is told before its
// stream ends.
var errBadBatch = errors.New("malformed message batch")

// protoSerializers is how many serializers protoactor registers (proto and
// JSON); a batch naming another would index past its table.
const protoSerializers = 2

// checkBatch reports the first envelope of b that protoactor's reader would
// index out of range or dereference as nil.
func checkBatch(b *remote.MessageBatch) error {
	for _, p := range b.GetTargets() {
		if p == nil {
			return fmt.Errorf("%w: nil target", errBadBatch)
		}
	}
	for _, p := range b.GetSenders() {
		if p == nil {
			return fmt.Errorf("%w: nil sender", errBadBatch)
		}
	}
	for i, e := range b.GetEnvelopes() {
		switch {
		case e == nil:
			return fmt.Errorf("%w: envelope %d is nil", errBadBatch, i)
		case e.Target < 0 || int(e.Target) >= len(b.GetTargets()):
			return fmt.Errorf("%w: envelope %d: target %d of %d", errBadBatch, i, e.Target, len(b.GetTargets()))
		case e.Sender < 0 || int(e.Sender) > len(b.GetSenders()): // 0 is "no sender", i is senders[i-1]
			return fmt.Errorf("%w: envelope %d: sender %d of %d", errBadBatch, i, e.Sender, len(b.GetSenders()))
		case e.TypeId < 0 || int(e.TypeId) >= len(b.GetTypeNames()):
			return fmt.Errorf("%w: envelope %d: type %d of %d", errBadBatch, i, e.TypeId, len(b.GetTypeNames()))
		case e.SerializerId < 0 || e.SerializerId >= protoSerializers:
			return fmt.Errorf("%w: envelope %d: serializer %d", errBadBatch, i, e.SerializerId)
		}
	}
	return nil
}

// checkedStream hands protoactor only batches that checkBatch accepts.
type checkedStream struct {
	grpc.ServerStream
	g *remoteGuard
}

// RecvMsg reads the next message and refuses a malformed batch: protoactor
// sees a read error and ends the stream.
func (s checkedStream) RecvMsg(m any) error {
	if err := s.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	if rm, ok := m.(*remote.RemoteMessage); ok {
		if b := rm.GetMessageBatch(); b != nil {
			if err := checkBatch(b); err != nil {
				s.g.log.Warn("remote: refused a peer's message", "peer", peerAddr(s.Context()), "err", err)
				return status.Error(codes.InvalidArgument, err.Error())
			}
		}
	}
	return nil
}

// stream is the gRPC stream interceptor: checked reads, recovered panics.
func (g *remoteGuard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
	defer g.recover(ss.Context(), info.FullMethod, &err)
	return handler(srv, checkedStream{ServerStream: ss, g: g})
}

// unary is the gRPC unary interceptor: recovered panics.
func (g *remoteGuard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer g.recover(ctx, info.FullMethod, &err)
	return handler(ctx, req)
}

// recover turns a panic in a handler into an Internal error for that one
// stream or call.
func (g *remoteGuard) recover(ctx context.Context, method string, err *error) {
	r := recover()
	if r == nil {
		return
	}
	g.log.Warn("remote: recovered a panic in protoactor's handler; ended the peer's stream",
		"peer", peerAddr(ctx), "method", method, "panic", fmt.Sprint(r))
	g.log.Debug("remote: recovered panic", "stack", string(debug.Stack()))
	*err = status.Error(codes.Internal, "internal error")
}

// serverOptions installs the guard on a gRPC server.
func (g *remoteGuard) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainStreamInterceptor(g.stream), grpc.ChainUnaryInterceptor(g.unary)}
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return "?"
}
