package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/nats-io/nats.go"
)

// TestMalformedPayloadsFromOutside throws junk at every endpoint with a plain
// NATS client (not our api.Client), under both content types, and checks
// that each gets a micro error with a code from the table and that connexd
// keeps serving.
func TestMalformedPayloadsFromOutside(t *testing.T) {
	pn := startConnexd(t, "solo", "--backend", "tcp")
	nc := connect(t, pn.natsURL)

	rng := rand.New(rand.NewSource(42)) // fixed: the same junk every run
	random := make([]byte, 512)
	_, _ = rng.Read(random)
	huge := make([]byte, 1<<20-4096) // near NATS's 1 MiB max payload
	_, _ = rng.Read(huge)
	payloads := map[string][]byte{
		"broken_json":      []byte(`{"engine_id": "e1", "block_ids": [1,2,`),
		"wrong_types":      []byte(`{"engine_id": 17, "block_ids": "abc", "layout": [1]}`),
		"random_bytes":     random,
		"near_1MiB_junk":   huge,
		"unknown_field":    []byte(`{"no_such_field": true}`),
		"truncated_varint": {0x08, 0xff, 0xff},
	}
	endpoints := []string{
		api.EpRegionRegister, api.EpRegionCreate, api.EpRegionInspect, api.EpEngineGone, api.EpEngineRegister, api.EpEngineNotices,
		api.EpEngineState, api.EpHoldCreate, api.EpHoldRenew,
		api.EpHoldRelease, api.EpHoldInspect, api.EpPullStart, api.EpPeerDescriptors, api.EpPeerPullEnd,
		api.EpRequestStart, api.EpRequestProgress, api.EpRequestFinish, api.EpRequestInspect, api.EpPeerAdopt,
	}
	known := map[int]bool{}
	for _, c := range []api.Code{api.CodeMalformed, api.CodeTooLarge, api.CodeBadRequest, api.CodeUnknownRegion,
		api.CodeBadBlockIDs, api.CodeBadLayout, api.CodeUnknownTransfer, api.CodeBadContentType, api.CodeUnknownRequest} {
		known[int(c)] = true
	}
	for _, ep := range endpoints {
		for name, data := range payloads {
			for _, ct := range []string{"", api.ContentJSON, "text/plain"} {
				msg := nats.NewMsg(api.Subject("solo", ep))
				msg.Data = data
				if ct != "" {
					msg.Header.Set(api.HeaderContentType, ct)
				}
				reply, err := nc.RequestMsg(msg, 5*time.Second)
				if err != nil {
					t.Fatalf("%s %s %q: no reply: %v", ep, name, ct, err)
				}
				code, err := strconv.Atoi(reply.Header.Get(api.HeaderErrorCode))
				if err != nil || !known[code] {
					// Some junk happens to decode as a valid protobuf message;
					// then the handler must still refuse it with a table code.
					t.Fatalf("%s %s %q: error code %q (%s), data %q", ep, name, ct, reply.Header.Get(api.HeaderErrorCode), reply.Header.Get(api.HeaderError), reply.Data)
				}
				if ct == "text/plain" && code != int(api.CodeBadContentType) {
					t.Fatalf("%s: text/plain answered %d", ep, code)
				}
				var body struct {
					Code int    `json:"code"`
					Name string `json:"name"`
				}
				if err := json.Unmarshal(reply.Data, &body); err != nil || body.Code != code || body.Name == "" {
					t.Fatalf("%s %s: error body %q", ep, name, reply.Data)
				}
			}
		}
	}
	// Still alive and discoverable as a NATS micro service.
	for _, subj := range []string{"$SRV.PING.connex", "$SRV.INFO.connex", "$SRV.STATS.connex"} {
		reply, err := nc.Request(subj, nil, 5*time.Second)
		if err != nil || !strings.Contains(string(reply.Data), `"name":"connex"`) {
			t.Fatalf("%s: %v %v", subj, err, reply)
		}
	}
	if !pn.running() {
		t.Fatalf("connexd died:\n%s", pn.logs())
	}
}

// TestBadIDsAreBadRequests: every endpoint answers an id that is empty, a
// wildcard, contains a dot, a NUL or a control character, or is over-long
// with 427 bad_request (or, for ids that only name something to look up,
// the code saying it does not exist) — never 500, never a crash.
func TestBadIDsAreBadRequests(t *testing.T) {
	pn := startConnexd(t, "solo", "--backend", "tcp")
	nc := connect(t, pn.natsURL)
	bad := []string{"", "*", ">", "a.b", "a\x00b", "a\nb", "a b", "\x7f", "a\u200bb", strings.Repeat("x", 129)}
	layout := `"layout":{"num_layers":1,"kv_planes":2,"num_blocks":4,"block_bytes":4096,"block_size":16,"tp_size":1}`
	// Each endpoint's payload with %s where the id goes (a JSON string); a
	// leading '?' marks an optional id, which may be empty.
	cases := map[string][]string{
		api.EpRegionRegister:  {`{"engine_id":%s,"region_id":"r0","path":"/dev/shm/x",` + layout + `}`, `{"engine_id":"e","region_id":%s,"path":"/dev/shm/x",` + layout + `}`},
		api.EpRegionCreate:    {`{"engine_id":%s,"region_id":"r0",` + layout + `}`, `{"engine_id":"e","region_id":%s,` + layout + `}`},
		api.EpRegionInspect:   {`{"engine_id":%s,"region_id":"r0"}`},
		api.EpEngineGone:      {`{"engine_id":%s}`},
		api.EpEngineRegister:  {`{"engine":{"engine_id":%s,"role":"decode","model":"m","base_url":"http://127.0.0.1:1"}}`},
		api.EpEngineNotices:   {`{"engine_id":%s}`},
		api.EpEngineState:     {`{"engine_id":%s}`},
		api.EpHoldCreate:      {`{"engine_id":%s,"region_id":"r0","block_ids":[1]}`, `?{"engine_id":"e","region_id":"r0","block_ids":[1],"consumer":%s}`},
		api.EpHoldRenew:       {`{"transfer_id":%s,"requester":"e"}`},
		api.EpHoldRelease:     {`{"transfer_id":%s,"requester":"e"}`},
		api.EpHoldInspect:     {`{"transfer_id":%s}`},
		api.EpPullStart:       {`{"params":{"transfer_id":%s},"engine_id":"e","region_id":"r0","block_ids":[1]}`},
		api.EpPeerDescriptors: {`{"transfer_id":%s,"requester":"e","pull_id":"p",` + layout + `}`, `{"transfer_id":"00000000000000000000000000000000","requester":"e","pull_id":%s,` + layout + `}`},
		api.EpPeerPullEnd:     {`{"transfer_id":%s,"pull_id":"p"}`},
		api.EpRequestStart:    {`{"request_id":%s,"engine_id":"e","params":{"transfer_id":"00000000000000000000000000000000"}}`, `{"request_id":"r","engine_id":%s,"params":{"transfer_id":"00000000000000000000000000000000"}}`},
		api.EpRequestProgress: {`{"request_id":%s,"epoch":"1"}`},
		api.EpRequestFinish:   {`{"request_id":%s,"epoch":"1"}`},
		api.EpRequestInspect:  {`{"request_id":%s}`},
		api.EpPeerAdopt:       {`{"request_id":%s,"dead_owner":"x"}`},
	}
	allowed := map[api.Code]bool{api.CodeBadRequest: true, api.CodeUnknownTransfer: true, api.CodeUnknownRequest: true, api.CodeUnknownRegion: true}
	for ep, payloads := range cases {
		for _, p := range payloads {
			optional := strings.HasPrefix(p, "?")
			for _, id := range bad {
				if optional && id == "" {
					continue
				}
				js, _ := json.Marshal(id)
				msg := nats.NewMsg(api.Subject("solo", ep))
				msg.Data = []byte(fmt.Sprintf(strings.TrimPrefix(p, "?"), js))
				msg.Header.Set(api.HeaderContentType, api.ContentJSON)
				reply, err := nc.RequestMsg(msg, 5*time.Second)
				if err != nil {
					t.Fatalf("%s %s: no reply: %v", ep, msg.Data, err)
				}
				code, _ := strconv.Atoi(reply.Header.Get(api.HeaderErrorCode))
				if !allowed[api.Code(code)] || (api.Code(code) != api.CodeBadRequest && id == "") {
					t.Errorf("%s %s: code %d (%s), want 427 bad_request", ep, msg.Data, code, reply.Header.Get(api.HeaderError))
				}
			}
		}
	}
	if !pn.running() {
		t.Fatal("connexd died")
	}
}
