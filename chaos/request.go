package chaos

import (
	"context"
	"fmt"
	"reflect"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// requestDeadline bounds one request end to end: invariant 1 (nothing
// hangs) is checked against it.
const requestDeadline = 60 * time.Second

// request drives one request: prefill (hold), start on a decode member,
// pull, generate with checkpoints, and on any failure of its member wait
// for the resume notice and carry on where the checkpoint says.
func (h *harness) request(ctx context.Context, i int) {
	ctx, cancel := context.WithTimeout(ctx, requestDeadline)
	defer cancel()
	id := fmt.Sprintf("req-%d-%d", h.cfg.Seed, i)
	seed := uint64(h.cfg.Seed)<<32 | uint64(i)
	h.mu.Lock()
	h.report.Requests++
	h.mu.Unlock()
	fail := func(format string, a ...any) {
		h.mu.Lock()
		h.report.Failed++
		h.mu.Unlock()
		h.log("%s failed: "+format, append([]any{id}, a...)...)
	}
	resumeCh := make(chan *messages.RequestState, 4)
	h.nmu.Lock()
	h.resumes[id] = resumeCh
	h.nmu.Unlock()
	defer func() { h.nmu.Lock(); delete(h.resumes, id); h.nmu.Unlock() }()

	// Prefill: KV into fresh prefill blocks, then hold them.
	nb := 4
	src, err := h.prefill.eng.alloc(nb, 30*time.Second)
	if err != nil {
		fail("prefill blocks: %v", err)
		return
	}
	fillKV(h.prefill.eng.region, src, seed)
	kv := checksum(h.prefill.eng.region, src)
	want := tokens(kv, 0, h.cfg.Tokens)
	p := prompt(seed, nb*int(layout.BlockSize))
	h.nmu.Lock()
	hold, err := h.prefill.eng.cli.CreateHold(ctx, &messages.CreateHoldRequest{EngineId: "engP", RegionId: "r0", BlockIds: src, NumTokens: uint32(len(p))})
	if err == nil {
		h.heldBy[hold.Params.TransferId] = src
	}
	h.nmu.Unlock()
	if err != nil {
		h.prefill.eng.release(src)
		fail("create hold: %v", err)
		return
	}
	h.mu.Lock()
	h.report.Prefills++
	h.mu.Unlock()

	// Start on a live decode member.
	live := h.live()
	if len(live) == 0 {
		fail("no live decode member")
		return
	}
	h.mu.Lock()
	m := live[h.rng.Intn(len(live))]
	h.mu.Unlock()
	st, err := m.eng.cli.StartRequest(ctx, &messages.StartRequestMsg{RequestId: id, Params: hold.Params, PromptTokenIds: p, EngineId: m.eng.id})
	if err != nil {
		fail("start on %s: %v", m.name, err)
		return
	}
	state := st.State
	for attempt := 0; ; attempt++ {
		if ctx.Err() != nil {
			h.violation("nothing lost: request %s did not finish within %s", id, requestDeadline)
			return
		}
		eng := h.engineOf(state.Owner)
		done, err := h.decode(ctx, id, eng, state, want)
		if err == nil {
			if !sameTokens(done.GeneratedTokenIds, want) {
				h.violation("same answer: %s finished with %d tokens differing from the uninterrupted output", id, len(done.GeneratedTokenIds))
				return
			}
			h.mu.Lock()
			h.report.Completed++
			h.mu.Unlock()
			return
		}
		if v, ok := err.(violationErr); ok {
			h.violation("%s", string(v))
			return
		}
		// The member failed (killed, frozen, fenced): wait for the
		// request to be resumed elsewhere.
		h.log("%s on %s interrupted (%v); waiting for resume", id, state.Owner, err)
		select {
		case next := <-resumeCh:
			if next.Epoch <= state.Epoch {
				continue
			}
			if next.Params.GetTransferId() != hold.Params.TransferId {
				h.violation("no second prefill: %s resumed with a different transfer", id)
				return
			}
			state = next
			h.mu.Lock()
			h.report.Resumed++
			h.mu.Unlock()
		case <-ctx.Done():
			h.violation("nothing lost: request %s was never resumed after its member failed", id)
			return
		}
	}
}

type violationErr string

func (v violationErr) Error() string { return string(v) }

func (h *harness) engineOf(member string) *engine {
	h.mu.Lock()
	defer h.mu.Unlock()
	if m, ok := h.members[member]; ok {
		return m.eng
	}
	return nil
}

// decode pulls the hold into eng's blocks, checks the tokens already
// generated (a resumed request recomputes them), generates the rest with
// checkpoints and finishes. It returns the final state, a violationErr for
// a broken invariant, or another error when the member failed.
func (h *harness) decode(ctx context.Context, id string, eng *engine, st *messages.RequestState, want []uint32) (*messages.RequestState, error) {
	if eng == nil {
		return nil, fmt.Errorf("owner %s unknown", st.Owner)
	}
	nb := len(st.Params.RemoteBlockIds)
	dst, err := eng.alloc(nb, 10*time.Second)
	if err != nil {
		return nil, err
	}
	defer eng.release(dst)
	pullID := fmt.Sprintf("%s-e%d", id, st.Epoch)
	ch := make(chan *messages.PullDone, 1)
	h.nmu.Lock()
	h.pullDone[pullID] = ch
	h.nmu.Unlock()
	defer func() { h.nmu.Lock(); delete(h.pullDone, pullID); h.nmu.Unlock() }()
	call, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = eng.cli.StartPull(call, &messages.StartPullRequest{Params: st.Params, EngineId: eng.id, RegionId: "r0", BlockIds: dst, PullId: pullID})
	cancel()
	if err != nil {
		return nil, err
	}
	select {
	case d := <-ch:
		if !d.Ok {
			if api.Code(d.ErrorCode) == api.CodeExpired || api.Code(d.ErrorCode) == api.CodeReleased {
				return nil, violationErr(fmt.Sprintf("no second prefill: %s could not re-pull its hold: %s", id, d.Error))
			}
			return nil, fmt.Errorf("pull: %s", d.Error)
		}
	case <-time.After(15 * time.Second):
		return nil, fmt.Errorf("pull %s: no completion notice", pullID)
	}
	kv := checksum(eng.region, dst)
	// Recompute what was generated before (the resume path) and check it.
	if got := st.GeneratedTokenIds; !sameTokens(got, tokens(kv, 0, len(got))) {
		return nil, violationErr(fmt.Sprintf("same answer: %s's checkpointed tokens differ from a recomputation on %s", id, eng.member))
	}
	epoch := st.Epoch
	for n := len(st.GeneratedTokenIds); n < len(want); {
		end := min(n+h.cfg.Every, len(want))
		select { // the engine "decodes" the next tokens
		case <-time.After(time.Duration(end-n) * h.cfg.TokenTime):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		call, cancel := context.WithTimeout(ctx, 3*time.Second)
		_, err := eng.cli.Progress(call, &messages.RequestProgress{RequestId: id, Epoch: epoch, TokenIds: tokens(kv, n, end)})
		cancel()
		if err != nil {
			return nil, err
		}
		n = end
	}
	call, cancel = context.WithTimeout(ctx, 3*time.Second)
	fin, err := eng.cli.FinishRequest(call, &messages.FinishRequestMsg{RequestId: id, Epoch: epoch})
	cancel()
	if err != nil {
		return nil, err
	}
	return fin.State, nil
}

// checkLeaks waits for every hold to be freed (released at finish, or
// expired after retain_s for requests that failed) and checks that every
// prefill block came back exactly once.
func (h *harness) checkLeaks(ctx context.Context) {
	deadline := time.Now().Add(20 * time.Second) // retain_s=5 plus slack
	for {
		ri, err := h.prefill.eng.cli.InspectRegion(ctx, &messages.RegionRef{EngineId: "engP", RegionId: "r0"})
		free := h.prefill.eng.freeCount()
		if err == nil && ri.BlocksHeld == 0 && free == int(layout.Blocks) {
			return
		}
		if time.Now().After(deadline) {
			h.violation("no leaked blocks: after the load %v blocks still held by connexd, engine has %d of %d free (err %v)", ri.GetBlocksHeld(), free, layout.Blocks, err)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func sameTokens(a, b []uint32) bool {
	return len(a) == len(b) && (len(a) == 0 || reflect.DeepEqual(a, b))
}
