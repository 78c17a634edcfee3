package api

import (
	"testing"

	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

// requestTypes are the messages the API decodes from the wire.
func requestTypes() []func() proto.Message {
	return []func() proto.Message{
		func() proto.Message { return new(messages.RegisterRegionRequest) },
		func() proto.Message { return new(messages.CreateRegionRequest) },
		func() proto.Message { return new(messages.RegionRef) },
		func() proto.Message { return new(messages.EngineGoneRequest) },
		func() proto.Message { return new(messages.CreateHoldRequest) },
		func() proto.Message { return new(messages.HoldRef) },
		func() proto.Message { return new(messages.StartPullRequest) },
		func() proto.Message { return new(messages.DescriptorsRequest) },
		func() proto.Message { return new(messages.PullEnd) },
		func() proto.Message { return new(messages.Descriptors) },
		func() proto.Message { return new(messages.PullDone) },
		func() proto.Message { return new(messages.BlocksFreed) },
	}
}

func seeds(f *testing.F) {
	good, _ := proto.Marshal(&messages.CreateHoldRequest{EngineId: "e", RegionId: "r", BlockIds: []uint32{1, 2, 3}})
	f.Add(good, false)
	f.Add([]byte(`{"engine_id":"e","region_id":"r","block_ids":[1,2,3]}`), true)
	f.Add([]byte(`{"params":{"transfer_id":"00","remote_ctrl":{"member":"m"}}}`), true)
	f.Add([]byte(`{"engine_id": 17}`), true)
	f.Add([]byte(`{`), true)
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, false)
	f.Add([]byte{}, false)
}

// FuzzUnmarshal checks that no input makes a decoder panic, that a decode
// either fails with CodeMalformed/CodeTooLarge or yields a message that
// re-encodes and decodes to an equal message.
func FuzzUnmarshal(f *testing.F) {
	seeds(f)
	f.Fuzz(func(t *testing.T, data []byte, isJSON bool) {
		for _, mk := range requestTypes() {
			m := mk()
			if e := Unmarshal(data, isJSON, 1<<16, m); e != nil {
				if e.Code != CodeMalformed && e.Code != CodeTooLarge {
					t.Fatalf("decode error with code %d", e.Code)
				}
				continue
			}
			out, err := Marshal(m, isJSON)
			if err != nil {
				t.Fatalf("re-encode %T: %v", m, err)
			}
			m2 := mk()
			if e := Unmarshal(out, isJSON, 1<<30, m2); e != nil {
				t.Fatalf("decode of our own encoding of %T failed: %v", m, e)
			}
			if !proto.Equal(m, m2) {
				t.Fatalf("%T does not round-trip: %v vs %v", m, m, m2)
			}
		}
	})
}

// FuzzContentType checks the header parser never panics and accepts only
// the two documented types.
func FuzzContentType(f *testing.F) {
	for _, s := range []string{"", "application/json", "application/protobuf", "application/json; charset=utf-8", "text/plain", "APPLICATION/JSON"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, ct string) {
		isJSON, err := contentType(map[string][]string{HeaderContentType: {ct}})
		if err != nil && err.Code != CodeBadContentType {
			t.Fatalf("code %d", err.Code)
		}
		if isJSON && err != nil {
			t.Fatal("json and an error")
		}
	})
}

func TestCodesAreUniqueAndNamed(t *testing.T) {
	seen := map[string]Code{}
	for c, n := range codeNames {
		if n == "" {
			t.Fatalf("code %d has no name", c)
		}
		if prev, dup := seen[n]; dup {
			t.Fatalf("name %q used by %d and %d", n, prev, c)
		}
		seen[n] = c
	}
}
