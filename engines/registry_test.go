package engines

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
	if err := r.Register(reg("b", 0).Engine, time.Second, t0); err != nil {
		t.Fatal(err)
	}
	if err := r.Register(reg("a", 0).Engine, 3*time.Second, t0); err != nil {
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
	if err := r.Register(reg("b", 0).Engine, time.Second, t0.Add(900*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if live, _ := r.Live(t0.Add(1500 * time.Millisecond)); len(live) != 2 {
		t.Fatalf("a renewed registration lapsed: %v", live)
	}
	live, lapsed = r.Live(t0.Add(1900 * time.Millisecond))
	if len(live) != 1 || fmt.Sprint(lapsed) != "[b]" {
		t.Fatalf("b should lapse at its renewed deadline: live %v lapsed %v", live, lapsed)
	}
	if !r.Remove("a") || r.Remove("a") {
		t.Fatal("Remove reports whether there was a registration")
	}
	// The table is bounded; lapsed entries make room.
	for i := 0; i < MaxEngines; i++ {
		if err := r.Register(reg(fmt.Sprint("e", i), 0).Engine, time.Second, t0); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Register(reg("one-more", 0).Engine, time.Second, t0); !errors.Is(err, ErrFull) {
		t.Fatalf("past MaxEngines: %v", err)
	}
	if err := r.Register(reg("one-more", 0).Engine, time.Second, t0.Add(2*time.Second)); err != nil {
		t.Fatalf("after the others lapsed: %v", err)
	}
	// Live hands out copies.
	live, _ = r.Live(t0.Add(2 * time.Second))
	live[0].Model = "changed"
	if again, _ := r.Live(t0.Add(2 * time.Second)); again[0].Model != "m" {
		t.Fatal("Live must return copies")
	}
}
