package router

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

const kelvin = "\u212A" // folds to "k" under Unicode simple folding (encoding/json's key match)

// TestClientCannotReachInternalKeys: a client body with kv_transfer_params
// under any spelling an engine could fold (a Kelvin sign, upper case), a key
// given twice, request_id or an unknown key is refused with 400 naming the
// key, and no engine sees a leg; a good request's legs carry only allowed
// keys and the router's own kv_transfer_params, and the client's answer
// names no transfer.
func TestClientCannotReachInternalKeys(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d := (&fakeEngine{t: t, id: "d", role: "decode"}).start()
	s := newTestRouter(t, p, d)
	victim := `{"transfer_id":"victim","do_remote_prefill":true,"remote_num_tokens":3}`
	cases := []struct{ body, param string }{
		{`{"model":"m","prompt":"a","` + kelvin + `v_transfer_params":` + victim + `}`, kelvin + "v_transfer_params"},
		{`{"model":"m","prompt":"a","KV_TRANSFER_PARAMS":` + victim + `}`, "KV_TRANSFER_PARAMS"},
		{`{"model":"m","prompt":"a","kv_transfer_params":` + victim + `}`, "kv_transfer_params"},
		{`{"model":"m","prompt":"a","request_id":"cmpl-victim"}`, "request_id"},
		{`{"model":"m","prompt":"a","Max_Tokens":3}`, "Max_Tokens"},
		{`{"model":"m","prompt":"a","prompt":[1,2]}`, "prompt"},
		{`{"model":"m","model":"other","prompt":"a"}`, "model"},
		{`{"model":"m","prompt":"a","connex_resume":true}`, "connex_resume"},
	}
	for _, c := range cases {
		resp, err := http.Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error APIError `json:"error"`
		}
		err = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 400 || e.Error.Code != CodeInvalidRequest || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("%s: %d %+v (%v); want 400 naming %q", c.body, resp.StatusCode, e.Error, err, c.param)
		}
	}
	if n := len(p.bodies) + len(d.bodies); n != 0 {
		t.Fatalf("refused requests reached engines: %d legs", n)
	}

	for _, stream := range []bool{false, true} {
		body := `{"model":"m","prompt":"abc","max_tokens":3,"temperature":0.5,"stream":` + map[bool]string{false: "false", true: "true"}[stream] +
			`,"stream_options":` + map[bool]string{false: "null", true: `{"include_usage":true}`}[stream] + `}`
		resp, err := http.Post(s.URL()+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !bytes.Contains(data, []byte(`"connex"`)) {
			t.Fatalf("stream=%v: %d %s", stream, resp.StatusCode, data)
		}
		if bytes.Contains(data, []byte("transfer_id")) || bytes.Contains(data, []byte(`"t1"`)) {
			t.Fatalf("stream=%v: the client's answer names the transfer: %s", stream, data)
		}
	}
	for _, b := range append(append([]map[string]any{}, p.bodies...), d.bodies...) {
		for k := range b {
			if !clientKeys[k] && k != "kv_transfer_params" {
				t.Errorf("a leg carries %q, which is neither a client key nor the router's", k)
			}
		}
	}
	if kv := d.bodies[0]["kv_transfer_params"].(map[string]any); kv["transfer_id"] != "t1" {
		t.Fatalf("decode leg params %v: want the prefill's", kv)
	}
}

// FuzzParseClient: whatever a client sends, an accepted body has no key
// that folds to an internal one, and every leg built from it, read the way
// a case-insensitive engine (encoding/json into a struct) reads it, carries
// exactly the router's kv_transfer_params and no key twice.
func FuzzParseClient(f *testing.F) {
	seeds := []string{
		`{"model":"m","prompt":"a"}`,
		`{"model":"m","prompt":"a","` + kelvin + `v_transfer_params":{"transfer_id":"x"}}`,
		`{"model":"m","prompt":"a","KV_transfer_params":{"transfer_id":"x"}}`,
		`{"model":"m","prompt":"a","kv_transfer_params":null}`,
		`{"model":"m","prompt":"a","prompt":"b"}`,
		`{"model":"m","model":"m","prompt":"a"}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true,"stream":false}`,
		`{"model":"m","prompt":[1,2,3],"max_tokens":4,"max_tokens":1}`,
		`{"model":"m","prompt":"a","stream_options":{"include_usage":true,"include_usage":false}}`,
		`{"model":"m","prompt":"a","tools":[{"kv_transfer_params":1}],"response_format":{"a":1,"a":2}}`,
		`{"model":"m","prompt":"a","\u006bv_transfer_params":{}}`,
		`{"model":"m","prompt":"a","ſtream":true}`,
		`{"model":"m","prompt":"a"} {"x":1}`,
		`[]`,
	}
	for _, s := range seeds {
		f.Add(s, false)
		f.Add(s, true)
	}
	params := json.RawMessage(`{"transfer_id":"router-set","do_remote_prefill":true}`)
	f.Fuzz(func(t *testing.T, body string, chat bool) {
		kind := Completions
		if chat {
			kind = Chat
		}
		c, aerr := ParseClient(kind, []byte(body))
		if aerr != nil {
			if aerr.Status != http.StatusBadRequest {
				t.Fatalf("refused with %d, want 400", aerr.Status)
			}
			return
		}
		for k := range c.Body {
			for _, in := range internalKeys {
				if strings.EqualFold(k, in) {
					t.Fatalf("accepted key %q folds to %s", k, in)
				}
			}
		}
		legs := [][]byte{PrefillBody(c)}
		if b, err := DecodeBody(c, params, "cmpl-1"); err == nil {
			legs = append(legs, b)
		} else {
			t.Fatal(err)
		}
		if b, err := ResumeBody(c, []uint32{1, 2}, []uint32{3}, params, "cmpl-1"); err == nil {
			legs = append(legs, b)
		} else {
			t.Fatal(err)
		}
		for i, leg := range legs {
			if _, err := decodeObject(leg); err != nil {
				t.Fatalf("leg %d is not a strict JSON object: %v\n%s", i, err, leg)
			}
			var folded struct {
				KV struct {
					TransferID string `json:"transfer_id"`
				} `json:"kv_transfer_params"`
			}
			if err := json.Unmarshal(leg, &folded); err != nil {
				t.Fatalf("leg %d: %v", i, err)
			}
			if i > 0 && folded.KV.TransferID != "router-set" {
				t.Fatalf("leg %d carries transfer %q to a folding engine, want the router's\n%s", i, folded.KV.TransferID, leg)
			}
			if i == 0 && folded.KV.TransferID != "" {
				t.Fatalf("the prefill leg carries transfer %q\n%s", folded.KV.TransferID, leg)
			}
		}
	})
}

// TestEngineErrorsNameNoTransfer: an engine's error relayed to the client
// (a failed KV load names its transfer) reaches it without the transfer id
// or anything shaped like one; the client's own request id stays.
func TestEngineErrorsNameNoTransfer(t *testing.T) {
	p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
	d := (&fakeEngine{t: t, id: "d", role: "decode", status: 503, code: CodeKVLoadFailed,
		msg: "KV load of transfer t1 failed: expired (hold 0123456789abcdef0123456789ABCDEF of request cmpl-00000000000000000000000000000000)"}).start()
	s := newTestRouter(t, p, d)
	status, _, body := call(t, "POST", s.URL()+"/v1/completions", "", `{"model":"m","prompt":"abc","stream":true}`)
	var e struct {
		Error APIError `json:"error"`
	}
	_ = json.Unmarshal([]byte(body), &e)
	msg := e.Error.Message
	if status != 503 || strings.Contains(msg, "t1") || strings.Contains(strings.ToLower(msg), "0123456789abcdef") ||
		!strings.Contains(msg, "cmpl-00000000000000000000000000000000") || !strings.Contains(msg, "transfer <transfer> failed") {
		t.Fatalf("%d %s: want a 503 naming no transfer", status, body)
	}
}
