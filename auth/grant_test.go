package auth_test

import (
	"errors"
	"testing"

	"github.com/connex/connex/auth"
)

// TestEngineGrantRoundTrip mints engine credentials with a role and a model
// (mixed case: NATS lowercases tags) and reads them back as connexd does
// from the JWTs the NATS server verified.
func TestEngineGrantRoundTrip(t *testing.T) {
	a, err := auth.Open(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []auth.Identity{
		{Role: auth.RoleEngine, Member: "d0", Engine: "vllm-d0", EngineRole: auth.EngineRoleDecode, Model: "Qwen/Qwen3-8B"},
		{Role: auth.RoleEngine, Member: "d0", Engine: "old"}, // minted without: any role and model
	} {
		creds, err := a.Creds(want, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, _, claims, err := auth.ParseCreds(creds)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := auth.IdentityOf(claims)
		if !ok || got != want {
			t.Fatalf("IdentityOf = %+v %v, want %+v", got, ok, want)
		}
		if claims.Limits.Subs != auth.EngineLimits.Subs || claims.Limits.Payload != auth.EngineLimits.Payload || claims.Limits.Data != auth.EngineLimits.Data {
			t.Fatalf("engine limits %+v, want %+v", claims.Limits.NatsLimits, auth.EngineLimits)
		}
	}
	id := auth.Identity{Role: auth.RoleEngine, Member: "d0", Engine: "e", EngineRole: auth.EngineRoleDecode, Model: "M"}
	if err := id.MayRegister("decode", "M"); err != nil {
		t.Fatalf("what the credentials allow: %v", err)
	}
	for _, c := range [][2]string{{"prefill", "M"}, {"decode", "m"}} {
		if err := id.MayRegister(c[0], c[1]); !errors.Is(err, auth.ErrNotAllowed) {
			t.Errorf("MayRegister(%s, %s) = %v, want ErrNotAllowed", c[0], c[1], err)
		}
	}
	if err := (auth.Identity{Role: auth.RoleEngine, Member: "d0", Engine: "e"}).MayRegister("prefill", "any"); err != nil {
		t.Errorf("credentials without a role or model: %v", err)
	}
	for _, bad := range []auth.Identity{
		{Role: auth.RoleEngine, Member: "m", Engine: "e", EngineRole: "router"},
		{Role: auth.RoleMember, Member: "m", EngineRole: "decode"},
		{Role: auth.RoleAdmin, Model: "m"},
	} {
		if err := bad.Validate(); !errors.Is(err, auth.ErrIdentity) {
			t.Errorf("Validate(%+v) = %v, want ErrIdentity", bad, err)
		}
	}
}
