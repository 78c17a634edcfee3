package simengine

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestSimKeysAreExact: the engine matches request keys exactly. Go's
// encoding/json would fold "\u212Av_transfer_params" (a Kelvin sign) or
// "KV_Transfer_Params" into kv_transfer_params, so a client that got such a
// key past a router would choose the hold the engine pulls; and a key given
// twice is read differently by different parsers. Both are refused before
// anything is held or pulled.
func TestSimKeysAreExact(t *testing.T) {
	kv := newFakeKV(t, "e1", &holdTable{m: map[string]fakeHold{}})
	ts := newTestServer(t, kv, 0)
	const kelvin = "\u212A"
	cases := []struct{ name, body, param string }{
		{"kelvin kv_transfer_params", `{"prompt":"hi","max_tokens":1,"` + kelvin + `v_transfer_params":{"do_remote_decode":true}}`, kelvin + "v_transfer_params"},
		{"upper-case kv_transfer_params", `{"prompt":"hi","max_tokens":1,"KV_Transfer_Params":{"do_remote_decode":true}}`, "KV_Transfer_Params"},
		{"upper-case max_tokens", `{"prompt":"hi","MAX_TOKENS":1}`, "MAX_TOKENS"},
		{"duplicated prompt", `{"prompt":"hi","prompt":"there","max_tokens":1}`, "prompt"},
		{"duplicated kv_transfer_params", `{"prompt":"hi","kv_transfer_params":null,"kv_transfer_params":{"do_remote_decode":true}}`, "kv_transfer_params"},
		{"folded include_usage", `{"prompt":"hi","stream":true,"stream_options":{"Include_Usage":true}}`, "stream_options"},
	}
	for _, c := range cases {
		status, body := post(t, ts.URL+"/v1/completions", c.body)
		var e struct {
			Error struct {
				Code  string
				Param *string
			}
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || status != 400 || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("%s: %d %s; want 400 naming %q", c.name, status, body, c.param)
		}
		if strings.Contains(body, "transfer_id") {
			t.Errorf("%s: the answer carries a transfer id: %s", c.name, body)
		}
	}
	if len(kv.holds.m) != 0 || !kv.allFree() {
		t.Fatalf("a refused request held blocks: %d holds", len(kv.holds.m))
	}
	// Exact keys still work, and unknown ones are ignored as vLLM does.
	if status, body := post(t, ts.URL+"/v1/completions", `{"prompt":"hi","max_tokens":2,"temperature":0,"kv_transfer_params":{"do_remote_decode":true}}`); status != 200 ||
		!strings.Contains(body, `"do_remote_prefill":true`) {
		t.Fatalf("exact keys: %d %s", status, body)
	}
}

// FuzzSimDecodeWire: a body the engine accepts has each of its keys once
// and no key that folds to a request field without being it.
func FuzzSimDecodeWire(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hi","max_tokens":1}`,
		`{"prompt":"hi","` + "\u212A" + `v_transfer_params":{"do_remote_decode":true}}`,
		`{"prompt":"hi","prompt":"x"}`,
		`{"Prompt":"hi","ſtream":true,"stream_options":{"include_usage":true,"INCLUDE_usage":false}}`,
		`{"kv_transfer_params":null,"kv_transfer_params":{}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		if _, herr := decodeWire([]byte(body)); herr != nil {
			return
		}
		obj, herr := strictObject([]byte(body), "")
		if herr != nil {
			t.Fatalf("accepted, yet not a strict object: %v", herr)
		}
		for key := range obj {
			for _, k := range wireKeys {
				if key != k && strings.EqualFold(key, k) {
					t.Fatalf("accepted key %q folds to %q", key, k)
				}
			}
		}
	})
}
