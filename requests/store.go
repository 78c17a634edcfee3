package requests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
)

// Store keeps request states durably with compare-and-set on revisions.
// A state is kept in two parts (see messages.RequestState): the record,
// which every write replaces, and the prompt (SplitState), written only
// when it is new, so that a write's cost does not grow with the prompt.
type Store interface {
	// Create stores a new request, its prompt and its record; ErrExists if
	// the id is taken.
	Create(ctx context.Context, st *messages.RequestState) (rev uint64, err error)
	// Update replaces the record if its revision is still rev; otherwise
	// ErrFenced (someone else wrote it). With prompt (PromptChanged) it
	// stores st's prompt first; without, only the record is written.
	Update(ctx context.Context, st *messages.RequestState, rev uint64, prompt bool) (uint64, error)
	// Get returns the whole state and its revision; ErrNotFound if absent.
	Get(ctx context.Context, id string) (*messages.RequestState, uint64, error)
	// Head returns the state without the prompt's token ids and
	// params.remote_block_ids (PromptLen and PromptDigest stand for them),
	// and its revision: all a takeover, a keep-alive or a rebind reads.
	Head(ctx context.Context, id string) (*messages.RequestState, uint64, error)
	// Delete removes the request if its revision is still rev.
	Delete(ctx context.Context, id string, rev uint64) error
}

// Bucket is the JetStream KV bucket holding request states.
const Bucket = "connex_requests"

// KVStore is the JetStream KV implementation of Store. A finished
// request leaves nothing behind in the bucket (see Delete), so the orphan
// scan (Owners) reads live requests only, however many have finished.
type KVStore struct {
	// KV is the bucket; writes and watches go through it.
	KV jetstream.KeyValue
	// Log, if set, gets a warning for a finished request whose delete
	// marker could not be purged (it then stays until request_ttl_s).
	Log    *slog.Logger
	nc     *nats.Conn          // for Get's reads from the stream leader
	js     jetstream.JetStream // Delete's marker
	stream jetstream.Stream    // Delete's purge
	// strayAfter is how old a prompt with no live record must be for
	// PurgeMarkers to purge it: a creation writes its prompt a moment
	// before its record, so a younger one may be a request starting now.
	strayAfter time.Duration
}

// strayPromptAge is KVStore.strayAfter: far beyond a creation's two writes
// (bounded by the caller's store timeout, seconds).
const strayPromptAge = time.Minute

// OpenKVStore creates or opens the bucket. replicas is the JetStream
// replication factor (1 for a single server); ttl (request_ttl_s) is how
// long an entry lives after its last write (0: for ever): a request whose
// owner neither progresses nor finishes for that long is dropped, so
// nothing strands state for nobody. Opening with another ttl updates the
// bucket.
func OpenKVStore(ctx context.Context, nc *nats.Conn, replicas int, ttl time.Duration, maxBytes int64) (*KVStore, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("requests: jetstream: %w", err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket: Bucket, Description: "Connex in-flight decode requests", History: 1,
		Storage: jetstream.FileStorage, Replicas: replicas, MaxValueSize: 8 << 20, TTL: ttl,
		MaxBytes: maxBytes,
	})
	if err != nil {
		return nil, fmt.Errorf("requests: kv bucket %s: %w", Bucket, err)
	}
	stream, err := js.Stream(ctx, "KV_"+Bucket)
	if err != nil {
		return nil, fmt.Errorf("requests: kv bucket %s: stream: %w", Bucket, err)
	}
	return &KVStore{KV: kv, nc: nc, js: js, stream: stream, strayAfter: strayPromptAge}, nil
}

// Unrecoverable reports an OpenKVStore error that waiting will not cure:
// the server has no JetStream (or not for this account), or it is a single
// server asked for replicas. Others, such as a cluster whose peers are
// still joining ("no suitable peers for placement") or a meta leader being
// elected, pass once the NATS cluster has formed.
func Unrecoverable(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case jetstream.JSErrCodeJetStreamNotEnabled, jetstream.JSErrCodeJetStreamNotEnabledForAccount,
			10074: // replicas > 1 not supported in non-clustered mode
			return true
		}
	}
	return errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount)
}

// Key is the KV key of a request id (ids are hashed-free but must be valid
// key tokens: letters, digits, '-', '_', '=', '/').
func Key(id string) string { return "r." + id }

// Create implements Store: the prompt first, so that a record is never
// read without it. A creation that lost (ErrExists) takes its prompt back
// unless the request that won names the same one (dropLostPrompt).
func (s *KVStore) Create(ctx context.Context, st *messages.RequestState) (uint64, error) {
	record, seq, err := s.storePrompt(ctx, st)
	if err != nil {
		return 0, err
	}
	rev, err := s.KV.Create(ctx, Key(st.RequestId), record)
	if errors.Is(err, jetstream.ErrKeyExists) {
		s.dropLostPrompt(ctx, st, seq)
		return 0, fmt.Errorf("%w: %s", ErrExists, st.RequestId)
	}
	if isFull(err) {
		return 0, fmt.Errorf("%w: create %s: %w", ErrStoreFull, st.RequestId, err)
	}
	if err != nil {
		return 0, fmt.Errorf("requests: create %s: %w", st.RequestId, err)
	}
	return rev, nil
}

// dropLostPrompt purges the prompt a creation that lost wrote (at seq),
// unless the request that won names the same key (the same prompt: a key
// names its content). Otherwise every refused request.start on a live id
// would leave a prompt, up to MiBs, until that request finished. Only up
// to seq: a creation of the same prompt since (after the winner finished)
// keeps its own. Best effort: what it cannot purge goes with the winner's
// finish or the start-up sweep.
func (s *KVStore) dropLostPrompt(ctx context.Context, st *messages.RequestState, seq uint64) {
	if won, _, err := s.Head(ctx, st.RequestId); err == nil && won.PromptKey == st.PromptKey {
		return
	}
	subject := "$KV." + Bucket + "." + st.PromptKey
	if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(seq+1)); err != nil && s.Log != nil {
		s.Log.Warn("a refused creation's prompt not purged; it goes with the request's finish", "request", st.RequestId, "err", err)
	}
}

// putPrompt stores st's prompt under its key and returns the record to
// write.
func (s *KVStore) putPrompt(ctx context.Context, st *messages.RequestState) ([]byte, error) {
	rec, _, err := s.storePrompt(ctx, st)
	return rec, err
}

// storePrompt is putPrompt, also returning the prompt's sequence.
func (s *KVStore) storePrompt(ctx context.Context, st *messages.RequestState) (record []byte, seq uint64, err error) {
	rec, prompt := SplitState(st)
	if st.PromptKey == "" {
		return nil, 0, fmt.Errorf("%w: request %s has no prompt key", ErrInvalid, st.RequestId)
	}
	data, err := proto.Marshal(prompt)
	if err != nil {
		return nil, 0, err
	}
	if seq, err = s.KV.Put(ctx, st.PromptKey, data); err != nil {
		if isFull(err) {
			return nil, 0, fmt.Errorf("%w: prompt of %s: %w", ErrStoreFull, st.RequestId, err)
		}
		return nil, 0, fmt.Errorf("requests: prompt of %s: %w", st.RequestId, err)
	}
	record, err = proto.Marshal(rec)
	return record, seq, err
}

// Update implements Store.
func (s *KVStore) Update(ctx context.Context, st *messages.RequestState, rev uint64, prompt bool) (uint64, error) {
	var data []byte
	var err error
	if prompt {
		data, err = s.putPrompt(ctx, st)
	} else {
		data, err = RecordBytes(st)
	}
	if err != nil {
		return 0, err
	}
	next, err := s.KV.Update(ctx, Key(st.RequestId), data, rev)
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			return 0, fmt.Errorf("%w: %s changed since revision %d", ErrFenced, st.RequestId, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) {
			return 0, fmt.Errorf("%w: %s changed since revision %d", ErrFenced, st.RequestId, rev)
		}
		if isFull(err) {
			return 0, fmt.Errorf("%w: update %s: %w", ErrStoreFull, st.RequestId, err)
		}
		return 0, fmt.Errorf("requests: update %s: %w", st.RequestId, err)
	}
	return next, nil
}

// RecordBytes is what an Update without the prompt writes for st: its
// record, encoded. A state without a prompt key (read from a record
// written before the split, never through Append, Adopt or Takeover) is
// written whole, as it was read.
func RecordBytes(st *messages.RequestState) ([]byte, error) {
	if st.PromptKey == "" {
		return proto.Marshal(st)
	}
	rec, _ := SplitState(st)
	return proto.Marshal(rec)
}

// isFull reports a write refused for lack of room: the bucket's MaxBytes,
// or JetStream's storage.
func isFull(err error) bool {
	if err == nil {
		return false
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case 10023, 10077: // nats-server's insufficient resources; stream store failed (maximum bytes exceeded)
			return true
		}
	}
	m := err.Error()
	return strings.Contains(m, "maximum bytes exceeded") || strings.Contains(m, "insufficient resources") || strings.Contains(m, "insufficient storage")
}

// Get implements Store: the record, then the prompt it names. Both are
// read from the bucket's stream leader (see Head).
func (s *KVStore) Get(ctx context.Context, id string) (*messages.RequestState, uint64, error) {
	st, rev, err := s.Head(ctx, id)
	if err != nil || st.PromptKey == "" { // a record before the split holds its prompt
		return st, rev, err
	}
	data, _, err := s.last(ctx, st.PromptKey)
	if err != nil {
		return nil, 0, fmt.Errorf("requests: prompt of %s: %w", id, err)
	}
	prompt := new(messages.RequestPrompt)
	if err := proto.Unmarshal(data, prompt); err != nil {
		return nil, 0, fmt.Errorf("requests: decode prompt of %s: %w", id, err)
	}
	return JoinState(st, prompt), rev, nil
}

// Head implements Store. It reads from the bucket's stream leader, not
// from whichever replica answers first (KeyValue.Get's direct get): a
// replica that was on the minority side of a partition serves the state
// from before it for a while after the partition heals, and a member
// deciding on it (who fenced it, whether it still owns a request) would act
// on an owner that is no longer there.
func (s *KVStore) Head(ctx context.Context, id string) (*messages.RequestState, uint64, error) {
	data, seq, err := s.last(ctx, Key(id))
	if err != nil {
		return nil, 0, err
	}
	st := new(messages.RequestState)
	if err := proto.Unmarshal(data, st); err != nil {
		return nil, 0, fmt.Errorf("requests: decode %s: %w", id, err)
	}
	return st, seq, nil
}

// last reads key's last value and its sequence from the stream leader;
// ErrNotFound if there is none or it was deleted.
func (s *KVStore) last(ctx context.Context, key string) ([]byte, uint64, error) {
	req, err := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{"$KV." + Bucket + "." + key})
	if err != nil {
		return nil, 0, err
	}
	m, err := s.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET.KV_"+Bucket, req)
	if err != nil {
		return nil, 0, fmt.Errorf("requests: get %s: %w", key, err)
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *struct {
			Seq  uint64 `json:"seq"`
			Hdrs []byte `json:"hdrs"`
			Data []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, 0, fmt.Errorf("requests: get %s: bad reply from JetStream: %w", key, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrCode == int(jetstream.JSErrCodeMessageNotFound):
		return nil, 0, fmt.Errorf("%w: %s", ErrNotFound, key)
	case resp.Error != nil:
		return nil, 0, fmt.Errorf("requests: get %s: %s (JetStream code %d)", key, resp.Error.Description, resp.Error.ErrCode)
	case resp.Message == nil:
		return nil, 0, fmt.Errorf("requests: get %s: empty reply from JetStream", key)
	}
	if len(resp.Message.Hdrs) > 0 {
		h, err := nats.DecodeHeadersMsg(resp.Message.Hdrs)
		if err != nil {
			return nil, 0, fmt.Errorf("requests: get %s: headers: %w", key, err)
		}
		// A delete or purge leaves a marker as the key's last message.
		if op := h.Get("KV-Operation"); op == "DEL" || op == "PURGE" {
			return nil, 0, fmt.Errorf("%w: %s", ErrNotFound, key)
		}
	}
	return resp.Message.Data, resp.Message.Seq, nil
}

// Delete implements Store: it removes the request if its revision is
// still rev (otherwise ErrFenced), and leaves nothing behind. A KV delete
// alone leaves a marker per finished request for request_ttl_s, and every
// orphan scan (a watch of the whole bucket) would read them all again:
// after 78k requests an idle member spent most of a core on them. So the
// marker, written with compare-and-set on rev as the fence, is then purged
// together with the value, up to the marker's own sequence only, so that a
// request created again under the same id since stays.
func (s *KVStore) Delete(ctx context.Context, id string, rev uint64) error {
	subject := "$KV." + Bucket + "." + Key(id)
	m := nats.NewMsg(subject)
	m.Header.Set("KV-Operation", "DEL")
	ack, err := s.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(rev))
	if err != nil {
		var apiErr *jetstream.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant) {
			return fmt.Errorf("%w: delete %s: changed since revision %d", ErrFenced, id, rev)
		}
		return fmt.Errorf("requests: delete %s: %w", id, err)
	}
	// The request is gone once the marker is written; a failed purge only
	// leaves the marker until request_ttl_s, which the caller cannot cure.
	if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(ack.Sequence+1)); err != nil && s.Log != nil {
		s.Log.Warn("finished request's delete marker not purged; orphan scans read it until request_ttl_s", "request", id, "err", err)
	}
	// Its prompts too: the one its record names, and any a lost creation
	// or a fenced takeover left.
	prompts := "$KV." + Bucket + ".p." + id + ".*"
	if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(prompts), jetstream.WithPurgeSequence(ack.Sequence+1)); err != nil && s.Log != nil {
		s.Log.Warn("finished request's prompt not purged; it stays until request_ttl_s", "request", id, "err", err)
	}
	return nil
}

// PurgeMarkers removes what finished requests left behind before Delete
// purged it all (a connexd before this one, a failed purge, a crash
// between Delete's marker and its purges): their delete markers, and
// stray prompts — a prompt key ("p.<id>.<digest>") older than a minute
// whose request has no live record. Each is purged up to its own
// sequence, so a request created again since stays. It says how many it
// removed. It reads the whole bucket once, keys and metadata only:
// connexd calls it once at start, never per scan, so that an upgraded
// cluster's orphan scans stop reading its old markers at once rather than
// after request_ttl_s, and a stray prompt does not hold request_store_bytes.
func (s *KVStore) PurgeMarkers(ctx context.Context) (int, error) {
	w, err := s.KV.WatchAll(ctx, jetstream.MetaOnly())
	if err != nil {
		return 0, fmt.Errorf("requests: purge markers: watch: %w", err)
	}
	defer w.Stop()
	var markers, prompts []jetstream.KeyValueEntry
	live := map[string]bool{} // request ids with a live record
collect:
	for {
		select {
		case e := <-w.Updates():
			if e == nil { // initial values done
				break collect
			}
			switch op := e.Operation(); {
			case op == jetstream.KeyValueDelete || op == jetstream.KeyValuePurge:
				markers = append(markers, e)
			case strings.HasPrefix(e.Key(), "r."):
				live[strings.TrimPrefix(e.Key(), "r.")] = true
			case strings.HasPrefix(e.Key(), "p."):
				prompts = append(prompts, e)
			}
		case <-ctx.Done():
			return 0, fmt.Errorf("requests: purge markers: %w", ctx.Err())
		}
	}
	// Stopped before purging, so the watch does not follow the purges.
	if err := w.Stop(); err != nil {
		return 0, fmt.Errorf("requests: purge markers: stop watch: %w", err)
	}
	for _, e := range prompts {
		id, _, ok := strings.Cut(strings.TrimPrefix(e.Key(), "p."), ".")
		if ok && !live[id] && time.Since(e.Created()) >= s.strayAfter {
			markers = append(markers, e)
		}
	}
	for i, e := range markers {
		subject := "$KV." + Bucket + "." + e.Key()
		if err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(subject), jetstream.WithPurgeSequence(e.Revision()+1)); err != nil {
			return i, fmt.Errorf("requests: purge %s: %w", e.Key(), err)
		}
	}
	return len(markers), nil
}

// Owners reads the owner of every live request the cluster resumes (for
// orphan scans); requests whose router decides where they resume
// (resume_authority "router") are not listed. It reads the bucket's live
// records ("r.*", not the prompts) and nothing of finished requests (Delete
// purges them); the client-side IgnoreDeletes only skips markers a failed
// purge, or a connexd before this one, left.
func (s *KVStore) Owners(ctx context.Context) (map[string]string, error) {
	w, err := s.KV.Watch(ctx, Key("*"), jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("requests: watch: %w", err)
	}
	defer w.Stop()
	out := map[string]string{}
	timeout := time.After(5 * time.Second)
	for {
		select {
		case e := <-w.Updates():
			if e == nil { // initial values done
				return out, nil
			}
			st := new(messages.RequestState)
			if proto.Unmarshal(e.Value(), st) == nil && st.ResumeAuthority != AuthorityRouter {
				out[st.RequestId] = st.Owner
			}
		case <-timeout:
			return nil, errors.New("requests: owner scan timed out")
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}
