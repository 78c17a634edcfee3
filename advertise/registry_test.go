package advertise

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/messages"
)

func token(s string) bool { return s != "" && !strings.ContainsAny(s, " .*>") }

func reg(id string, ttl uint32) *messages.RegisterEngineRequest {
	return &messages.RegisterEngineRequest{TtlMs: ttl, Engine: &messages.EngineInfo{EngineId: id, Role: RoleDecode, Model: "m", BaseUrl: "http://10.0.0.1:8100", BlocksTotal: 8, BlocksFree: 8}}
}

func TestValidate(t *testing.T) {
	if ttl, err := Validate(reg("e1", 0), token); err != nil || ttl != DefaultTTL {
		t.Fatalf("default TTL: %v %v", ttl, err)
	}
	if ttl, err := Validate(reg("e1", 1500), token); err != nil || ttl != 1500*time.Millisecond {
		t.Fatalf("ttl_ms 1500: %v %v", ttl, err)
	}
	withParser := reg("e1", 0)
	withParser.Engine.ReasoningParser = "deepseek_r1"
	if _, err := Validate(withParser, token); err != nil {
		t.Fatalf("reasoning_parser deepseek_r1: %v", err)
	}
	bad := map[string]func(r *messages.RegisterEngineRequest){
		"missing engine":     func(r *messages.RegisterEngineRequest) { r.Engine = nil },
		"engine_id":          func(r *messages.RegisterEngineRequest) { r.Engine.EngineId = "a.b" },
		"role":               func(r *messages.RegisterEngineRequest) { r.Engine.Role = "chef" },
		"model":              func(r *messages.RegisterEngineRequest) { r.Engine.Model = "" },
		"blocks_free":        func(r *messages.RegisterEngineRequest) { r.Engine.BlocksFree = 9 },
		"base_url scheme":    func(r *messages.RegisterEngineRequest) { r.Engine.BaseUrl = "ftp://h:1" },
		"base_url with /v1":  func(r *messages.RegisterEngineRequest) { r.Engine.BaseUrl = "http://h:1/v1/" },
		"base_url with host": func(r *messages.RegisterEngineRequest) { r.Engine.BaseUrl = "http://" },
		"ttl too short":      func(r *messages.RegisterEngineRequest) { r.TtlMs = 10 },
		"ttl too long":       func(r *messages.RegisterEngineRequest) { r.TtlMs = 3_600_000 },
		// Fields that travel in every heartbeat stay small.
		"base_url too long": func(r *messages.RegisterEngineRequest) {
			r.Engine.BaseUrl = "http://h:1/" + strings.Repeat("x", MaxBaseURL)
		},
		"instance_id":       func(r *messages.RegisterEngineRequest) { r.Engine.InstanceId = "a b" },
		"instance_id 2 MiB": func(r *messages.RegisterEngineRequest) { r.Engine.InstanceId = strings.Repeat("i", 2<<20) },
		"reasoning_parser":  func(r *messages.RegisterEngineRequest) { r.Engine.ReasoningParser = "qwen3 --x" },
		"reasoning_parser 1 KiB": func(r *messages.RegisterEngineRequest) {
			r.Engine.ReasoningParser = strings.Repeat("p", 1024)
		},
	}
	for name, mod := range bad {
		r := reg("e1", 0)
		mod(r)
		if _, err := Validate(r, token); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}
}

func TestRegistryLapsesAndRenews(t *testing.T) {
	r := NewRegistry()
	t0 := time.Unix(100, 0)
	if _, _, err := r.Register(reg("b", 0).Engine, time.Second, t0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Register(reg("a", 0).Engine, 3*time.Second, t0); err != nil {
		t.Fatal(err)
	}
	live, lapsed := r.Live(t0.Add(999 * time.Millisecond))
	if len(live) != 2 || live[0].EngineId != "a" || len(lapsed) != 0 {
		t.Fatalf("before any TTL: %v %v", live, lapsed)
	}
	if next := r.NextExpiry(); !next.Equal(t0.Add(time.Second)) {
		t.Fatalf("next expiry %v", next)
	}
	// A renewal pushes the deadline out.
	if replaced, _, err := r.Register(reg("b", 0).Engine, time.Second, t0.Add(900*time.Millisecond)); err != nil || replaced != nil {
		t.Fatalf("a renewal of the same instance replaces nothing: %v %v", replaced, err)
	}
	if live, _ := r.Live(t0.Add(1500 * time.Millisecond)); len(live) != 2 {
		t.Fatalf("a renewed registration lapsed: %v", live)
	}
	live, lapsed = r.Live(t0.Add(1900 * time.Millisecond))
	if len(live) != 1 || fmt.Sprint(lapsed) != "[{b }]" {
		t.Fatalf("b should lapse at its renewed deadline: live %v lapsed %v", live, lapsed)
	}
	if _, ok := r.Remove("a"); !ok {
		t.Fatal("Remove reports whether there was a registration")
	}
	if _, ok := r.Remove("a"); ok {
		t.Fatal("a second Remove found a registration")
	}
	// The table is bounded; lapsed entries make room.
	for i := 0; i < MaxEngines; i++ {
		if _, _, err := r.Register(reg(fmt.Sprint("e", i), 0).Engine, time.Second, t0); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := r.Register(reg("one-more", 0).Engine, time.Second, t0); !errors.Is(err, ErrFull) {
		t.Fatalf("past MaxEngines: %v", err)
	}
	_, lapsed, err := r.Register(reg("one-more", 0).Engine, time.Second, t0.Add(2*time.Second))
	if err != nil {
		t.Fatalf("after the others lapsed: %v", err)
	}
	// What made room is reported, for the caller to end.
	if len(lapsed) != MaxEngines {
		t.Fatalf("Register reported %d lapsed registrations, want the %d it dropped", len(lapsed), MaxEngines)
	}
	// Live hands out copies.
	live, _ = r.Live(t0.Add(2 * time.Second))
	live[0].Model = "changed"
	if again, _ := r.Live(t0.Add(2 * time.Second)); again[0].Model != "m" {
		t.Fatal("Live must return copies")
	}
}

func TestRegistryRestartEndsThePreviousInstance(t *testing.T) {
	r := NewRegistry()
	t0 := time.Unix(100, 0)
	first := reg("e", 0).Engine
	first.InstanceId = "i1"
	if _, _, err := r.Register(first, time.Second, t0); err != nil {
		t.Fatal(err)
	}
	if r.Instance("e") != "i1" {
		t.Fatalf("instance %q", r.Instance("e"))
	}
	second := reg("e", 0).Engine
	second.InstanceId = "i2"
	replaced, _, err := r.Register(second, time.Second, t0.Add(100*time.Millisecond))
	if err != nil || replaced == nil || *replaced != (Ended{Engine: "e", Instance: "i1"}) {
		t.Fatalf("a new instance must end the old one: %v %v", replaced, err)
	}
	if ended, ok := r.Remove("e"); !ok || ended.Instance != "i2" {
		t.Fatalf("remove: %v %v", ended, ok)
	}
}
