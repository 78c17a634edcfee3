package router

import (
	"testing"

	"github.com/connex/connex/messages"
)

func eng(id, role, model string, inFlight, free uint32) Engine {
	return Engine{Member: "m-" + id, Info: &messages.EngineInfo{EngineId: id, Role: role, Model: model, InFlight: inFlight, BlocksFree: free, BaseUrl: "http://" + id}}
}

func TestPick(t *testing.T) {
	es := []Engine{
		eng("d2", "decode", "m", 1, 100),
		eng("d1", "decode", "m", 1, 100),
		eng("d3", "decode", "m", 0, 10),
		eng("d4", "decode", "other", 0, 1000),
		eng("p1", "prefill", "m", 0, 1000),
	}
	cases := []struct {
		name string
		busy map[string]int
		skip map[string]bool
		want string
		ok   bool
	}{
		{"least in flight wins over free blocks", nil, nil, "d3", true},
		{"the router's own legs count", map[string]int{"d3": 2}, nil, "d1", true},
		{"ties go to more free blocks, then the smaller id", nil, map[string]bool{"d3": true}, "d1", true},
		{"skipped engines are never picked", nil, map[string]bool{"d1": true, "d2": true, "d3": true}, "", false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := Pick(es, "decode", "m", c.busy, c.skip)
			if ok != c.ok || got.Info.GetEngineId() != c.want {
				t.Fatalf("Pick = %q, %v; want %q, %v", got.Info.GetEngineId(), ok, c.want, c.ok)
			}
		})
	}
	all, servable := Models(es)
	if len(all) != 2 || !servable["m"] || servable["other"] {
		t.Fatalf("Models = %v %v", all, servable)
	}
}

// TestPickSuspects: an engine whose member is suspect (silent, probed, not
// gone) is passed over while an unsuspected one qualifies, however loaded,
// and chosen when it is the only one left: a CPU-starved box makes every
// member late at once, and refusing them answered no_engine while every
// engine lived (issue 30).
func TestPickSuspects(t *testing.T) {
	sus := eng("d9", "decode", "x", 0, 1)
	sus.Suspect = true
	busy := eng("d1", "decode", "x", 40, 0)
	if got, ok := Pick([]Engine{sus, busy}, "decode", "x", nil, nil); !ok || got.Info.GetEngineId() != "d1" {
		t.Fatalf("Pick = %q, %v; want the unsuspected d1 although the suspect is idle", got.Info.GetEngineId(), ok)
	}
	if got, ok := Pick([]Engine{sus, busy}, "decode", "x", nil, map[string]bool{"d1": true}); !ok || got.Info.GetEngineId() != "d9" {
		t.Fatalf("Pick = %q, %v; want the suspect d9 when it is the only engine left", got.Info.GetEngineId(), ok)
	}
	if _, ok := Pick([]Engine{sus}, "decode", "x", nil, map[string]bool{"d9": true}); ok {
		t.Fatal("a skipped suspect was picked")
	}
	if _, servable := Models([]Engine{sus, eng("p1", "prefill", "x", 0, 1)}); !servable["x"] {
		t.Fatal("a model whose decode engine is suspect is not servable")
	}
}
