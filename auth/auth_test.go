package auth_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/auth"
	"github.com/connex/connex/cluster"
	"github.com/nats-io/jwt/v2"
)

// allowed reports whether subject is within one of the patterns.
func allowed(patterns jwt.StringList, subject string) bool {
	return slices.ContainsFunc(patterns, func(p string) bool { return jwt.Subject(subject).IsContainedIn(jwt.Subject(p)) })
}

// TestPermissionsMatchTheSubjects checks each role's permissions against
// the subjects api and cluster really use: what the role needs is allowed,
// what would let it act for another is not.
func TestPermissionsMatchTheSubjects(t *testing.T) {
	eng := auth.Identity{Role: auth.RoleEngine, Member: "m1", Engine: "e1"}
	p := eng.Permissions()
	for _, s := range []string{api.EngineSubject("m1", "e1", api.EpHoldCreate), api.EngineSubject("m1", "e1", api.EpRequestFinish)} {
		if !allowed(p.Pub.Allow, s) {
			t.Errorf("engine may not publish %s", s)
		}
	}
	for _, s := range []string{
		api.Subject("m1", api.EpHoldRelease), api.Subject("m1", api.EpPeerDescriptors), api.EngineSubject("m1", "e2", api.EpHoldCreate),
		api.EngineSubject("m2", "e1", api.EpHoldCreate), "$KV.connex_requests.r1", "$JS.API.STREAM.INFO.KV_connex_requests",
		api.FreedSubject("m1", "e1"), cluster.DefaultSubjectPrefix + ".connex.events.heartbeat.x",
	} {
		if allowed(p.Pub.Allow, s) {
			t.Errorf("engine may publish %s", s)
		}
	}
	for _, s := range []string{api.FreedSubject("m1", "e1"), api.PullDoneSubject("m1", "e1"), api.ResumeSubject("m1", "e1"), eng.InboxPrefix() + ".abc.1"} {
		if !allowed(p.Sub.Allow, s) {
			t.Errorf("engine may not subscribe to %s", s)
		}
	}
	// Nor another engine's, nor those of an engine of the same id on
	// another member (its notices carry a prompt at a resume).
	for _, s := range []string{api.FreedSubject("m1", "e2"), "_INBOX.abc", "_INBOX.e.m1.e2.x", api.Subject("m1", api.EpPeerDescriptors), "$SRV.PING",
		api.FreedSubject("m2", "e1"), api.ResumeSubject("m2", "e1"), "_INBOX.e.m2.e1.x"} {
		if allowed(p.Sub.Allow, s) {
			t.Errorf("engine may subscribe to %s", s)
		}
	}

	mem := auth.Identity{Role: auth.RoleMember, Member: "m1"}
	p = mem.Permissions()
	for _, s := range []string{api.Subject("m1", api.EpPeerDescriptors), api.EngineSubject("m1", "e7", api.EpHoldCreate), cluster.DefaultSubjectPrefix + ".connex.events.heartbeat.x", cluster.DefaultSubjectPrefix + ".connex.ping.x", "$SRV.PING.connex", mem.InboxPrefix() + ".x"} {
		if !allowed(p.Sub.Allow, s) {
			t.Errorf("member may not subscribe to %s", s)
		}
	}
	for _, s := range []string{api.Subject("m2", api.EpPeerDescriptors), api.EngineSubject("m2", "e7", api.EpHoldCreate), api.FreedSubject("m1", "e1"), "_INBOX.m.m2.x", "_INBOX.e.m1.e1.x"} {
		if allowed(p.Sub.Allow, s) {
			t.Errorf("member m1 may subscribe to %s", s)
		}
	}
	for _, s := range []string{api.Subject("m2", api.EpPeerDescriptors), api.FreedSubject("m1", "e1"), "$KV.connex_requests.r1", "$JS.API.INFO"} {
		if !allowed(p.Pub.Allow, s) {
			t.Errorf("member may not publish %s", s)
		}
	}
}

func TestIdentityValidate(t *testing.T) {
	for _, bad := range []auth.Identity{
		{Role: "root"}, {Role: auth.RoleMember}, {Role: auth.RoleMember, Member: "a.b"}, {Role: auth.RoleMember, Member: "m", Engine: "e"},
		{Role: auth.RoleEngine, Member: "m"}, {Role: auth.RoleEngine, Member: "m", Engine: "*"}, {Role: auth.RoleEngine, Member: "m", Engine: "e>"},
		{Role: auth.RoleEngine, Member: "m", Engine: strings.Repeat("x", 129)}, {Role: auth.RoleAdmin, Member: "m"},
		// A member named "engine": its engines could publish other engines'
		// notices (connex.v1.engine.<member>.<engine>.<kind>).
		{Role: auth.RoleMember, Member: "engine"}, {Role: auth.RoleEngine, Member: "engine", Engine: "e"},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v: valid, want an error", bad)
		}
	}
	for _, good := range []auth.Identity{{Role: auth.RoleAdmin}, {Role: auth.RoleMember, Member: "decode-0"}, {Role: auth.RoleEngine, Member: "m", Engine: "vllm_d0"}} {
		if err := good.Validate(); err != nil {
			t.Errorf("%+v: %v", good, err)
		}
	}
}

// TestAuthorityPersistsAndMints: the authority is created once (0700
// directory, 0600 seeds) and the same keys come back on reopen, so
// credentials minted before a restart stay valid; minted credentials
// carry the identity's name, permissions and expiry, signed by the account.
func TestAuthorityPersistsAndMints(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "auth")
	if _, err := auth.Open(dir, false); err == nil {
		t.Fatal("opening a missing authority without create succeeded")
	}
	a, err := auth.Open(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dir)
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("authority directory: %v %v, want 0700", st.Mode(), err)
	}
	for _, f := range []string{"operator.nk", "account.nk", "system.nk"} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v, want 0600", f, st.Mode(), err)
		}
	}
	b, err := auth.Open(dir, true)
	if err != nil {
		t.Fatal(err)
	}
	if a.AccountPublicKey() != b.AccountPublicKey() || a.OperatorPublicKey() != b.OperatorPublicKey() {
		t.Fatal("reopening the authority gave other keys")
	}
	id := auth.Identity{Role: auth.RoleEngine, Member: "m", Engine: "e"}
	path := filepath.Join(t.TempDir(), "e.creds")
	if err := b.WriteCreds(path, id, time.Hour); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("creds file: %v %v, want 0600", st.Mode(), err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, seed, claims, err := auth.ParseCreds(data)
	if err != nil || !strings.HasPrefix(seed, "SU") {
		t.Fatalf("parse creds: %v (seed %.2s…)", err, seed)
	}
	if claims.Name != "engine:m/e" || claims.Issuer != a.AccountPublicKey() || claims.Expires == 0 {
		t.Fatalf("claims: name %q issuer %q expires %d", claims.Name, claims.Issuer, claims.Expires)
	}
	if !slices.Equal(claims.Permissions.Pub.Allow, id.Permissions().Pub.Allow) {
		t.Fatalf("claims carry %v, want %v", claims.Permissions.Pub.Allow, id.Permissions().Pub.Allow)
	}
	if _, err := a.Creds(auth.Identity{Role: auth.RoleEngine, Member: "m"}, 0); err == nil {
		t.Fatal("minted credentials for an engine without an id")
	}
	if err := os.WriteFile(filepath.Join(dir, "account.nk"), []byte("not a seed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.Open(dir, true); err == nil || !strings.Contains(err.Error(), "account.nk") {
		t.Fatalf("a corrupt seed: %v, want an error naming the file", err)
	}
	conf, err := b.ServerConfig()
	if err != nil || !strings.Contains(conf, "operator: ") || !strings.Contains(conf, "resolver_preload") || !strings.Contains(conf, b.AccountPublicKey()) {
		t.Fatalf("server config: %v\n%s", err, conf)
	}
}

// TestIdsAgreeWithTheAPI: an id auth mints credentials for is one the API
// accepts, and the other way round.
func TestIdsAgreeWithTheAPI(t *testing.T) {
	for _, id := range []string{"decode-0", "vllm_d0", "", "a.b", "*", "x>", "tab\t", "\x7f", "\xff", "\u00a0", "\ufffd", "é", strings.Repeat("x", 128), strings.Repeat("x", 129)} {
		mine := (auth.Identity{Role: auth.RoleMember, Member: id}).Validate() == nil
		if mine != api.ValidToken(id) {
			t.Errorf("member id %q: auth says %v, api.ValidToken says %v", id, mine, api.ValidToken(id))
		}
	}
}
