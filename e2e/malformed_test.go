package e2e

import (
	"encoding/json"
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
		api.EpRegionRegister, api.EpRegionCreate, api.EpRegionInspect, api.EpEngineGone, api.EpHoldCreate, api.EpHoldRenew,
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
