package requests

import (
	"errors"
	"fmt"
	"time"

	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

// Errors callers branch on.
var (
	// ErrFenced means the caller's epoch is stale: the request moved to
	// another owner. The caller must stop acting on it.
	ErrFenced = errors.New("requests: fenced: the request has a newer owner")
	// ErrExists means a request id is already in use.
	ErrExists = errors.New("requests: request already exists")
	// ErrNotFound means no such request (finished or never started).
	ErrNotFound = errors.New("requests: no such request")
	// ErrInvalid means a request's fields are unusable.
	ErrInvalid = errors.New("requests: invalid request")
	// ErrStoreFull means the request bucket reached request_store_bytes
	// (or JetStream ran out of room): no new request state can be written.
	ErrStoreFull = errors.New("requests: the request state store is full")
	// ErrNotOrphan means an adopt was asked for a request whose owner changed.
	ErrNotOrphan = errors.New("requests: request is not an orphan of that member")
)

// AuthorityRouter is the resume_authority of a request whose router decides
// where it resumes: the engine it moves to takes it over (Takeover), and the
// cluster's orphan coordinator leaves it alone.
const AuthorityRouter = "router"

// ValidID reports whether id can name a request: 1-128 letters, digits,
// '-', '_', '=' or '/' (what a JetStream KV key allows, without '.').
func ValidID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '=' || c == '/') {
			return false
		}
	}
	return true
}

// MaxTokens bounds prompt plus generated tokens of one request.
const MaxTokens = 1 << 20

// New builds the initial state of a request started on owner.
func New(start *messages.StartRequestMsg, owner string, now time.Time) (*messages.RequestState, error) {
	st, err := newState(start, owner, now)
	if err != nil {
		return nil, err
	}
	withPrompt(st, start.PromptTokenIds)
	return st, nil
}

// newState is New without the prompt: start checked, and the state at
// epoch 1 with neither prompt nor digest.
func newState(start *messages.StartRequestMsg, owner string, now time.Time) (*messages.RequestState, error) {
	switch {
	case !ValidID(start.RequestId):
		return nil, fmt.Errorf("%w: request_id=%q: want 1-128 letters, digits, '-', '_', '=' or '/'", ErrInvalid, start.RequestId)
	case start.Params == nil || start.Params.TransferId == "":
		return nil, fmt.Errorf("%w: params.transfer_id is empty", ErrInvalid)
	case len(start.PromptTokenIds) == 0 || len(start.PromptTokenIds) > MaxTokens:
		return nil, fmt.Errorf("%w: %d prompt tokens (1..%d allowed)", ErrInvalid, len(start.PromptTokenIds), MaxTokens)
	case start.Params.RemoteNumTokens > uint32(len(start.PromptTokenIds)):
		return nil, fmt.Errorf("%w: remote_num_tokens=%d exceeds the %d prompt tokens", ErrInvalid, start.Params.RemoteNumTokens, len(start.PromptTokenIds))
	}
	switch start.ResumeAuthority {
	case "", AuthorityRouter:
	default:
		return nil, fmt.Errorf("%w: resume_authority %q (allowed: \"\" for the cluster, %q)", ErrInvalid, start.ResumeAuthority, AuthorityRouter)
	}
	return &messages.RequestState{
		RequestId: start.RequestId, Params: start.Params,
		Owner: owner, Epoch: 1, EngineId: start.EngineId, UpdatedUnixMs: now.UnixMilli(),
		ResumeAuthority: start.ResumeAuthority,
		// Past MaxGenerated the store's own bound is the tighter one.
		MaxTokens: min(start.MaxTokens, MaxGenerated),
	}, nil
}

// Takeover returns st moved to owner and start's engine with the next
// epoch: a resume decided by the router, which resends the request to
// another engine. The activation that ran it before is fenced by the epoch.
// The new start must name the same transfer; its tokens are the prompt plus
// the tokens generated so far. When they start with st's prompt (and name
// the same hold blocks) the stored prompt stays and the rest become the
// generated tokens, so the takeover writes nothing that grows with the
// prompt (st needs only its record: PromptLen and PromptDigest); otherwise
// they all become a new prompt.
func Takeover(st *messages.RequestState, start *messages.StartRequestMsg, owner string, now time.Time) (*messages.RequestState, error) {
	fresh, err := newState(start, owner, now)
	if err != nil {
		return nil, err
	}
	if st.GetParams().GetTransferId() != start.GetParams().GetTransferId() {
		// Never name the request's transfer: a request id is not a
		// secret, its transfer id is.
		return nil, fmt.Errorf("%w: takeover of request %s: params.transfer_id is not the request's transfer", ErrInvalid, st.RequestId)
	}
	if toks := start.PromptTokenIds; extendsPrompt(st, toks, start.Params.RemoteBlockIds) {
		n := PromptLen(st)
		fresh.GeneratedTokenIds = toks[n:]
		fresh.PromptTokenIds, fresh.PromptLen = toks[:n:n], uint32(n)
		fresh.PromptDigest = digestOf(st)
		fresh.PromptKey = PromptKey(fresh.RequestId, fresh.PromptDigest)
		fresh.PromptStoredUnixMs = st.PromptStoredUnixMs // the stored prompt stays, with its age
		if fresh.MaxTokens > 0 {
			// The new engine's max_tokens is what is left of the request's.
			fresh.MaxTokens = uint32(min(int(fresh.MaxTokens)+len(fresh.GeneratedTokenIds), MaxGenerated))
		}
	} else {
		withPrompt(fresh, toks)
	}
	fresh.Epoch = st.Epoch + 1
	fresh.PreviousOwners = append(append([]string(nil), st.PreviousOwners...), st.Owner)
	if fresh.ResumeAuthority == "" {
		fresh.ResumeAuthority = st.ResumeAuthority
	}
	return fresh, nil
}

// Append returns the state with tokens appended, if epoch is current.
func Append(st *messages.RequestState, epoch uint64, tokens []uint32, now time.Time) (*messages.RequestState, error) {
	if epoch != st.Epoch {
		return nil, fmt.Errorf("%w: epoch %d, current %d (owner %s)", ErrFenced, epoch, st.Epoch, st.Owner)
	}
	if PromptLen(st)+len(st.GeneratedTokenIds)+len(tokens) > MaxTokens {
		return nil, fmt.Errorf("%w: more than %d tokens", ErrInvalid, MaxTokens)
	}
	if limit := st.MaxTokens; limit > 0 && len(st.GeneratedTokenIds)+len(tokens) > int(limit) {
		return nil, fmt.Errorf("%w: %d generated tokens would pass the request's max_tokens=%d", ErrInvalid, len(st.GeneratedTokenIds)+len(tokens), limit)
	}
	if len(st.GeneratedTokenIds)+len(tokens) > MaxGenerated {
		return nil, fmt.Errorf("%w: more than %d generated tokens in one request", ErrInvalid, MaxGenerated)
	}
	next := proto.Clone(st).(*messages.RequestState)
	next.GeneratedTokenIds = append(next.GeneratedTokenIds, tokens...)
	next.UpdatedUnixMs = now.UnixMilli()
	migrate(next)
	return next, nil
}

// Adopt returns the state moved from deadOwner to newOwner with the next
// epoch. It fails with ErrNotOrphan if the request is no longer owned by
// deadOwner (someone adopted it already).
func Adopt(st *messages.RequestState, deadOwner, newOwner, engine string, now time.Time) (*messages.RequestState, error) {
	if st.Owner != deadOwner {
		return nil, fmt.Errorf("%w: owned by %s, not %s", ErrNotOrphan, st.Owner, deadOwner)
	}
	next := proto.Clone(st).(*messages.RequestState)
	next.PreviousOwners = append(next.PreviousOwners, st.Owner)
	next.Owner, next.EngineId, next.Epoch = newOwner, engine, st.Epoch+1
	next.UpdatedUnixMs = now.UnixMilli()
	migrate(next)
	return next, nil
}

// migrate gives a state read from a record written before the split (its
// prompt in the record, no prompt key) a prompt key, so that its next write
// stores the prompt apart, once, and the writes after it only the record.
func migrate(st *messages.RequestState) {
	if st.PromptKey == "" && len(st.PromptTokenIds) > 0 {
		withPrompt(st, st.PromptTokenIds)
	}
}

// PromptRefreshDiv divides request_ttl_s into the age at which a stored
// prompt is written again with the record (PromptDue): the bucket's age
// limit counts from each key's own last write, and a running request
// rewrites only its record, so its prompt would expire under it. A request
// stays whole (adoptable) for at least (1 - 1/PromptRefreshDiv) of
// request_ttl_s after its last write.
const PromptRefreshDiv = 10

// PromptDue reports whether a write of next must store its prompt too, and
// when it must, stamps next's record with the time it is stored (next's
// UpdatedUnixMs): when its prompt is not the one stored with prev
// (PromptChanged), or when the stored one is refresh old or older (a
// request running longer than refresh; refresh 0: never). A record that
// does not say when its prompt was stored (written before
// prompt_stored_unix_ms) stores it at its next write.
func PromptDue(prev, next *messages.RequestState, refresh time.Duration) bool {
	due := PromptChanged(prev, next) || (refresh > 0 && next.UpdatedUnixMs-next.PromptStoredUnixMs >= refresh.Milliseconds())
	if due {
		next.PromptStoredUnixMs = next.UpdatedUnixMs
	}
	return due
}

// PromptChanged reports whether next's prompt is not the one stored with
// prev (nil: nothing stored), so a write of next must store it too.
func PromptChanged(prev, next *messages.RequestState) bool {
	return prev == nil || next.GetPromptKey() != prev.GetPromptKey()
}

// ResumeTokens is what a resumed engine must feed: the prompt followed by
// the tokens generated so far. Only Params.RemoteNumTokens of them have KV
// in the hold; the rest are recomputed locally.
func ResumeTokens(st *messages.RequestState) (all []uint32, loaded uint32) {
	all = append(append([]uint32(nil), st.PromptTokenIds...), st.GeneratedTokenIds...)
	return all, st.Params.GetRemoteNumTokens()
}
