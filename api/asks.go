package api

import (
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
)

// Asks sends requests to one endpoint of a member without waiting for them:
// Post publishes on the caller's goroutine and returns, and every answer
// arrives on C, delivered there by the NATS connection's reader itself (one
// subscription on a wildcard inbox of the Asks' own; no goroutine in
// between). It is for a caller that must not lose the time of a goroutine
// hand-off before its request leaves (a pull's peer.descriptors, sent while
// pull.start is being answered) and that asks again while earlier asks are
// outstanding (the first answer wins). Decode an answer with Asks.Decode.
// Close it when done: later answers are dropped by the server.
type Asks struct {
	c      *Client
	ep     string
	subj   string
	inbox  string // the wildcard subscription's prefix; ask n answers on inbox.n
	sub    *nats.Subscription
	ch     chan *nats.Msg
	n      atomic.Uint64
	closed sync.Once
}

// maxAnswersQueued bounds the answers an Asks queues unread; an answer
// beyond it is dropped (the NATS client reports a slow consumer), which
// costs nothing but that answer: the first one wins and the rest are
// duplicates.
const maxAnswersQueued = 16

// NewAsks subscribes the inbox the answers to c's requests to endpoint ep
// will come to. The subscription is on its way to the server before any
// Post (NATS keeps a connection's protocol in order), so no answer can
// overtake it.
func (c *Client) NewAsks(ep string) (*Asks, error) {
	a := &Asks{c: c, ep: ep, subj: c.subject(ep), inbox: c.NC.NewInbox(), ch: make(chan *nats.Msg, maxAnswersQueued)}
	sub, err := c.NC.ChanSubscribe(a.inbox+".*", a.ch)
	if err != nil {
		return nil, fmt.Errorf("api: %s on member %s: subscribe to the answers: %w", ep, c.Member, err)
	}
	a.sub = sub
	return a, nil
}

// Post sends in; its answer arrives on C.
func (a *Asks) Post(in proto.Message) error {
	msg, err := a.c.request(a.subj, in)
	if err != nil {
		return err
	}
	msg.Reply = a.inbox + "." + strconv.FormatUint(a.n.Add(1), 10)
	if err := a.c.NC.PublishMsg(msg); err != nil {
		return fmt.Errorf("api: %s on member %s: %w", a.ep, a.c.Member, err)
	}
	return nil
}

// C delivers the answers to every Post, in the order they arrive.
func (a *Asks) C() <-chan *nats.Msg { return a.ch }

// Decode decodes an answer from C into out, as Client.Call would have: a
// member that does not answer (NATS's no-responders status) is an *Error
// with CodePeerUnavailable whose Cause is nats.ErrNoResponders, an API
// failure is an *Error.
func (a *Asks) Decode(m *nats.Msg, out proto.Message) error {
	if m.Header.Get(statusHeader) == noRespondersStatus && len(m.Data) == 0 {
		return noResponders(a.ep, a.c.Member, nats.ErrNoResponders)
	}
	return decodeReply(a.ep, m, out)
}

// Close unsubscribes; answers still on their way are dropped. Idempotent.
func (a *Asks) Close() {
	a.closed.Do(func() { _ = a.sub.Unsubscribe() })
}

// The header and status NATS answers a request with when nothing
// subscribes to its subject (nats.go keeps them unexported).
const (
	statusHeader       = "Status"
	noRespondersStatus = "503"
)

// noResponders is the error of a call nothing received: callers may send
// it again.
func noResponders(ep, member string, cause error) *Error {
	e := Errorf(CodePeerUnavailable, "%s on member %s: %v", ep, member, cause)
	e.Cause = cause
	return e
}

// request is the NATS message of a call of c to subject subj.
func (c *Client) request(subj string, in proto.Message) (*nats.Msg, error) {
	data, err := Marshal(in, c.JSON)
	if err != nil {
		return nil, fmt.Errorf("api: encode %s: %w", describe(in), err)
	}
	msg := nats.NewMsg(subj)
	msg.Data = data
	if c.JSON {
		msg.Header.Set(HeaderContentType, ContentJSON)
	}
	return msg, nil
}

// decodeReply decodes the answer to a call of endpoint ep into out, or
// returns the API error it carries.
func decodeReply(ep string, reply *nats.Msg, out proto.Message) error {
	if e := decodeErrorHeaders(reply.Header.Get(HeaderErrorCode), reply.Header.Get(HeaderError)); e != nil {
		return e
	}
	isJSON := reply.Header.Get(HeaderContentType) == ContentJSON
	if e := Unmarshal(reply.Data, isJSON, 64<<20, out); e != nil {
		return fmt.Errorf("api: %s reply: %w", ep, e)
	}
	return nil
}
