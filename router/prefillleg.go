package router

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
)

// The prefill leg: a prefill engine computes the prompt's KV and answers
// with the kv_transfer_params that name its hold.

// transferOf is the transfer id in a prefill's kv_transfer_params ("" if none).
func transferOf(params json.RawMessage) string {
	var kv struct {
		TransferID string `json:"transfer_id"`
	}
	_ = json.Unmarshal(params, &kv)
	return kv.TransferID
}

// prefilled is what the prefill leg produced.
type prefilled struct {
	engine    string
	params    json.RawMessage
	promptIDs []uint32
}

// prefill runs the prefill leg, on another prefill engine if the first
// cannot be reached or fails on its side.
func (s *Server) prefill(ctx context.Context, c *ClientRequest, rid string) (*prefilled, *APIError) {
	skip := map[string]bool{}
	body := PrefillBody(c)
	var last *APIError
	for attempt := 0; attempt < 2; attempt++ {
		e, ok := Pick(s.live(), "prefill", c.Model, s.busySnapshot(), skip)
		if !ok {
			break
		}
		id := e.Info.GetEngineId()
		skip[id] = true
		s.metrics.prefills.WithLabelValues(c.Model).Inc()
		p, err := s.prefillOn(ctx, e, c, body)
		if err == nil {
			// The transfer id goes to the log only: it names the hold every
			// decode leg pulls, which no client may learn (it would be the
			// handle of a takeover).
			if s.log.Enabled(ctx, slog.LevelInfo) { // transferOf decodes the params: not for a line nobody logs
				s.log.Info("prefilled", "request_id", rid, "engine", id, "prompt_tokens", len(p.promptIDs), "transfer", transferOf(p.params))
			}
			return p, nil
		}
		last = err
		if err.Status >= 400 && err.Status < 500 {
			return nil, err // the request itself is wrong: another engine says the same
		}
		if ctx.Err() != nil {
			// The client left: the engine did not fail, and no other
			// engine should prefill for nobody.
			return nil, err
		}
		s.log.Warn("prefill leg failed; trying another prefill engine", "request_id", rid, "engine", id, "err", err.Message)
	}
	if last == nil {
		last = unavailable(CodeNoEngine, "no live prefill engine serves model %q", c.Model)
	}
	return nil, last
}

func (s *Server) prefillOn(ctx context.Context, e Engine, c *ClientRequest, body []byte) (*prefilled, *APIError) {
	id := e.Info.GetEngineId()
	done := s.track(id)
	defer done()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PrefillTimeout)
	defer cancel()
	resp, err := s.up.post(ctx, e.Info.GetBaseUrl()+c.Kind.Path(), body, "")
	if err != nil {
		return nil, unavailable(CodeEngineFailed, "prefill engine %s unreachable: %v", id, err)
	}
	defer resp.Body.Close()
	data, err := readBody(io.LimitReader(resp.Body, maxPrefillAnswer), resp.Length, maxPrefillAnswer)
	if err != nil {
		return nil, unavailable(CodeEngineFailed, "prefill engine %s: reading its answer: %v", id, err)
	}
	if resp.Status != http.StatusOK {
		return nil, engineError(resp.Status, data, id)
	}
	ans, err := parsePrefillAnswer(data)
	if err != nil {
		return nil, serverError(CodeEngineFailed, "prefill engine %s answered something that is not a completion: %v", id, err)
	}
	if len(ans.KVTransferParams) == 0 || isNull(ans.KVTransferParams) {
		return nil, serverError(CodeEngineFailed, "prefill engine %s answered without kv_transfer_params: is it running with a kv_producer connector?", id)
	}
	p := &prefilled{engine: id, params: ans.KVTransferParams, promptIDs: ans.PromptTokenIDs}
	if len(p.promptIDs) == 0 && len(ans.Choices) > 0 {
		p.promptIDs = ans.Choices[0].PromptTokenIDs
	}
	return p, nil
}
