package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
)

// startSim starts connex-sim next to connexd member and waits for its ready line.
func startSim(t testing.TB, natsURL, member, id, role string, extra ...string) *proc {
	t.Helper()
	args := append([]string{"--role", role, "--nats", natsURL, "--member", member, "--engine-id", id,
		"--layout", "small", "--blocks", "64", "--prefill-us-per-token", "20", "--decode-ms-per-token", "10", "--log-level", "info"}, extra...)
	args = append(args, credsFlags(t, natsURL, "--nats-creds", "--role", "engine", "--member", member, "--engine", id)...)
	return startProc(t, "connex-sim", productBinaries(t).Sim, id, args)
}

// simPost posts a JSON body and returns the status and the response body.
func simPost(t testing.TB, url string, body any) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("POST %s: read: %v", url, err)
	}
	return resp.StatusCode, out
}

type simCompletion struct {
	Choices []struct {
		Text           string   `json:"text"`
		TokenIDs       []uint32 `json:"token_ids"`
		PromptTokenIDs []uint32 `json:"prompt_token_ids"`
		FinishReason   *string  `json:"finish_reason"`
	} `json:"choices"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	Connex           *struct {
		KVLoad           string `json:"kv_load"`
		LoadedTokens     int    `json:"loaded_tokens"`
		RecomputedTokens int    `json:"recomputed_tokens"`
		Prefills         int    `json:"prefills"`
		EngineID         string `json:"engine_id"`
	} `json:"connex"`
	Error *struct {
		Message string `json:"message"`
		Code    string `json:"code"`
	} `json:"error"`
}

// complete runs a non-streamed completion and expects 200.
func complete(t testing.TB, base string, body map[string]any) simCompletion {
	t.Helper()
	body["model"], body["return_token_ids"] = "connex-sim", true
	code, out := simPost(t, base+"/v1/completions", body)
	if code != http.StatusOK {
		t.Fatalf("completion on %s: %d %s", base, code, out)
	}
	var c simCompletion
	if err := json.Unmarshal(out, &c); err != nil || len(c.Choices) != 1 {
		t.Fatalf("completion on %s: %v: %s", base, err, out)
	}
	return c
}

// paramsWith adds keys to kv_transfer_params JSON.
func paramsWith(t testing.TB, raw json.RawMessage, kv map[string]any) map[string]any {
	t.Helper()
	m := map[string]any{}
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("kv_transfer_params %s: %v", raw, err)
	}
	for k, v := range kv {
		m[k] = v
	}
	return m
}

// simMetrics reads an engine's /metrics as series -> value.
func simMetrics(t testing.TB, base string) map[string]float64 {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || line == "" {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err == nil {
			out[line[:i]] = v
		}
	}
	return out
}

func prefillsOf(m map[string]float64) float64 {
	return m[`connex_sim_prefills_total{kind="local"}`] + m[`connex_sim_prefills_total{kind="remote_prefill"}`] + m[`connex_sim_prefills_total{kind="recompute_after_load_failure"}`]
}

// sseTokens reads a streamed completion, calling each with the token ids
// of every chunk; it returns the ids and whether [DONE] came.
func sseTokens(t testing.TB, resp *http.Response, each func(ids []uint32) bool) ([]uint32, bool) {
	t.Helper()
	var ids []uint32
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			return ids, true
		}
		var c simCompletion
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			t.Fatalf("bad chunk %q: %v", data, err)
		}
		for _, ch := range c.Choices {
			ids = append(ids, ch.TokenIDs...)
		}
		if each != nil && !each(ids) {
			return ids, false
		}
	}
	return ids, false
}

// TestSimPrefillDecodeResume runs one prefill and two decode connexd +
// connex-sim pairs on one NATS (the prefill connexd embeds it) and drives
// the engines over HTTP, as a router would: a P/D request equals a local
// one and frees the prefill blocks; a decode engine killed mid-stream is
// resumed on the other with prompt + k tokens (no second prefill, no
// over-count); a gone hold fails with kv_load_failed or is recomputed.
func TestSimPrefillDecodeResume(t *testing.T) {
	p0 := startConnexd(t, "simp0", "--backend", "tcp", "--role", "prefill", "--cluster-preset", "local")
	url := p0.natsURL
	startConnexd(t, "simd0", "--backend", "tcp", "--role", "decode", "--cluster-preset", "local", "--nats-url", url)
	startConnexd(t, "simd1", "--backend", "tcp", "--role", "decode", "--cluster-preset", "local", "--nats-url", url, "--kv-load-failure-policy", "recompute")
	pe := startSim(t, url, "simp0", "sim-p0", "prefill")
	d0 := startSim(t, url, "simd0", "sim-d0", "decode")
	d1 := startSim(t, url, "simd1", "sim-d1", "decode")
	nc := connect(t, url)
	pcli := &api.Client{NC: nc, Member: "simp0"}

	prefillFree := func(t *testing.T) {
		t.Helper()
		checkFor(t, 10*time.Second, 10*time.Millisecond, func() error {
			m := simMetrics(t, pe.httpURL)
			ri, err := pcli.InspectRegion(ctx5(t), &messages.RegionRef{EngineId: "sim-p0", RegionId: "r0"})
			if err != nil {
				return err
			}
			if m["connex_sim_holds"] != 0 || m["connex_sim_blocks_free"] != m["connex_sim_blocks_total"] || ri.BlocksHeld != 0 {
				return fmt.Errorf("prefill engine: holds=%v free=%v of %v, connexd blocks_held=%d", m["connex_sim_holds"], m["connex_sim_blocks_free"], m["connex_sim_blocks_total"], ri.BlocksHeld)
			}
			return nil
		})
	}
	prefillLeg := func(t *testing.T, prompt string) (json.RawMessage, *messages.KVTransferParams) {
		t.Helper()
		c := complete(t, pe.httpURL, map[string]any{"prompt": prompt, "max_tokens": 1, "kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false}})
		var kp struct {
			DoRemotePrefill bool     `json:"do_remote_prefill"`
			DoRemoteDecode  bool     `json:"do_remote_decode"`
			TransferID      string   `json:"transfer_id"`
			RemoteNumTokens uint32   `json:"remote_num_tokens"`
			RemoteBlockIDs  []uint32 `json:"remote_block_ids"`
		}
		if err := json.Unmarshal(c.KVTransferParams, &kp); err != nil || !kp.DoRemotePrefill || kp.DoRemoteDecode || kp.TransferID == "" {
			t.Fatalf("prefill leg's kv_transfer_params %s (%v)", c.KVTransferParams, err)
		}
		if kp.RemoteNumTokens != uint32(len(prompt)) || len(c.Choices[0].TokenIDs) != 1 {
			t.Fatalf("prefill leg: remote_num_tokens=%d for a %d-token prompt, %d tokens", kp.RemoteNumTokens, len(prompt), len(c.Choices[0].TokenIDs))
		}
		return c.KVTransferParams, &messages.KVTransferParams{TransferId: kp.TransferID, RemoteNumTokens: kp.RemoteNumTokens, RemoteBlockIds: kp.RemoteBlockIDs}
	}

	t.Run("pd_equals_local", func(t *testing.T) {
		prompt := "Connex keeps the prefill KV as a renewable hold."
		ref := complete(t, d1.httpURL, map[string]any{"prompt": prompt, "max_tokens": 12})
		if ref.Connex.KVLoad != "local" || ref.Connex.Prefills != 1 {
			t.Fatalf("local request's connex object: %+v", ref.Connex)
		}
		raw, kp := prefillLeg(t, prompt)
		if got := ref.Choices[0].TokenIDs[0]; kp == nil || got == 0 {
			t.Fatal("no reference tokens")
		}
		body, _ := json.Marshal(map[string]any{"model": "connex-sim", "prompt": prompt, "max_tokens": 12, "stream": true, "return_token_ids": true,
			"kv_transfer_params": paramsWith(t, raw, map[string]any{"connex_request_id": "sim-req-a"})})
		resp, err := http.Post(d0.httpURL+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b, _ := io.ReadAll(resp.Body)
			t.Fatalf("decode leg: %d %s", resp.StatusCode, b)
		}
		ids, done := sseTokens(t, resp, nil)
		if !done || !slices.Equal(ids, ref.Choices[0].TokenIDs) {
			t.Fatalf("decode leg streamed %v (done=%v), the local request gave %v", ids, done, ref.Choices[0].TokenIDs)
		}
		prefillFree(t)
	})

	t.Run("hold_gone_fail", func(t *testing.T) {
		prompt := "This hold is released before the decode leg."
		raw, kp := prefillLeg(t, prompt)
		if _, err := pcli.Release(ctx5(t), &messages.HoldRef{TransferId: kp.TransferId, Requester: "sim-p0"}); err != nil {
			t.Fatal(err)
		}
		prefillFree(t)
		before := simMetrics(t, d0.httpURL)
		code, out := simPost(t, d0.httpURL+"/v1/completions", map[string]any{"model": "connex-sim", "prompt": prompt, "max_tokens": 8, "stream": true, "kv_transfer_params": paramsWith(t, raw, nil)})
		var c simCompletion
		_ = json.Unmarshal(out, &c)
		if code != http.StatusServiceUnavailable || c.Error == nil || c.Error.Code != "kv_load_failed" ||
			!strings.Contains(c.Error.Message, kp.TransferId) || !strings.Contains(c.Error.Message, "released") {
			t.Fatalf("decode leg of a released hold (policy fail): %d %s", code, out)
		}
		after := simMetrics(t, d0.httpURL)
		if after["connex_sim_blocks_free"] != after["connex_sim_blocks_total"] || prefillsOf(after) != prefillsOf(before) {
			t.Fatalf("after the failed load: blocks %v of %v free, prefills %v -> %v", after["connex_sim_blocks_free"], after["connex_sim_blocks_total"], prefillsOf(before), prefillsOf(after))
		}
	})

	t.Run("resume_after_kill", func(t *testing.T) {
		prompt := "Resume me on another decode engine, please."
		const n, k = 30, 6
		ref := complete(t, pe.httpURL, map[string]any{"prompt": prompt, "max_tokens": n})
		raw, kp := prefillLeg(t, prompt)
		body, _ := json.Marshal(map[string]any{"model": "connex-sim", "prompt": prompt, "max_tokens": n, "stream": true, "return_token_ids": true,
			"kv_transfer_params": paramsWith(t, raw, map[string]any{"connex_request_id": "sim-req-b"})})
		resp, err := http.Post(d0.httpURL+"/v1/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, _ := sseTokens(t, resp, func(ids []uint32) bool { return len(ids) < k })
		d0.kill()
		resp.Body.Close()
		if len(got) != k || !slices.Equal(got, ref.Choices[0].TokenIDs[:k]) {
			t.Fatalf("first %d streamed tokens %v, want %v", k, got, ref.Choices[0].TokenIDs[:k])
		}
		before := simMetrics(t, d1.httpURL)
		// The test plays the router: its word that sim-d1 may take the
		// request over (peer.grant, members and admins only).
		if _, err := (&api.Client{NC: nc, Member: "simd1"}).GrantTakeover(ctx5(t), &messages.StartRequestMsg{RequestId: "sim-req-b", EngineId: "sim-d1", Takeover: true}); err != nil {
			t.Fatal(err)
		}
		resumed := complete(t, d1.httpURL, map[string]any{
			"prompt": append(slices.Clone(ref.Choices[0].PromptTokenIDs), got...), "max_tokens": n - k,
			"kv_transfer_params": paramsWith(t, raw, map[string]any{"connex_request_id": "sim-req-b", "connex_resume": true}),
		})
		if !slices.Equal(resumed.Choices[0].TokenIDs, ref.Choices[0].TokenIDs[k:]) {
			t.Fatalf("resumed tokens %v\nwant %v", resumed.Choices[0].TokenIDs, ref.Choices[0].TokenIDs[k:])
		}
		after := simMetrics(t, d1.httpURL)
		delta := func(s string) float64 { return after[s] - before[s] }
		if c := resumed.Connex; c.KVLoad != "pulled" || c.LoadedTokens != int(kp.RemoteNumTokens) || c.RecomputedTokens != k || c.Prefills != 0 {
			t.Fatalf("resumed request's connex object: %+v, want pulled, %d loaded, %d recomputed, 0 prefills", c, kp.RemoteNumTokens, k)
		}
		if delta("connex_sim_kv_loaded_tokens_total") != float64(kp.RemoteNumTokens) || delta("connex_sim_recomputed_tokens_total") != k ||
			prefillsOf(after) != prefillsOf(before) || delta("connex_sim_resumes_total") != 1 {
			t.Fatalf("decode-1 metrics: loaded +%v (want %d), recomputed +%v (want %d), prefills +%v (want 0), resumes +%v",
				delta("connex_sim_kv_loaded_tokens_total"), kp.RemoteNumTokens, delta("connex_sim_recomputed_tokens_total"), k,
				prefillsOf(after)-prefillsOf(before), delta("connex_sim_resumes_total"))
		}
		prefillFree(t) // decode-1's request.finish released the hold
	})

	t.Run("hold_gone_recompute", func(t *testing.T) {
		prompt := "Recompute me when the hold has gone away."
		ref := complete(t, pe.httpURL, map[string]any{"prompt": prompt, "max_tokens": 10})
		raw, kp := prefillLeg(t, prompt)
		if _, err := pcli.Release(ctx5(t), &messages.HoldRef{TransferId: kp.TransferId, Requester: "sim-p0"}); err != nil {
			t.Fatal(err)
		}
		prefillFree(t)
		before := simMetrics(t, d1.httpURL)
		c := complete(t, d1.httpURL, map[string]any{"prompt": prompt, "max_tokens": 10, "kv_transfer_params": paramsWith(t, raw, nil)})
		if !slices.Equal(c.Choices[0].TokenIDs, ref.Choices[0].TokenIDs) || c.Choices[0].Text != ref.Choices[0].Text {
			t.Fatalf("recomputed answer %q %v, want %q %v", c.Choices[0].Text, c.Choices[0].TokenIDs, ref.Choices[0].Text, ref.Choices[0].TokenIDs)
		}
		after := simMetrics(t, d1.httpURL)
		if c.Connex.KVLoad != "recomputed" || c.Connex.Prefills != 1 ||
			after[`connex_sim_prefills_total{kind="recompute_after_load_failure"}`]-before[`connex_sim_prefills_total{kind="recompute_after_load_failure"}`] != 1 ||
			prefillsOf(after)-prefillsOf(before) != 1 {
			t.Fatalf("recompute: connex %+v, prefills +%v", c.Connex, prefillsOf(after)-prefillsOf(before))
		}
	})
}
