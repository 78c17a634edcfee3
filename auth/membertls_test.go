package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

func newAuthority(t *testing.T) *Authority {
	t.Helper()
	a, err := Open(t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func mint(t *testing.T, a *Authority, id Identity, ttl time.Duration) []byte {
	t.Helper()
	c, err := a.Creds(id, ttl)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func memberPair(t *testing.T, creds []byte) (server, client *tls.Config) {
	t.Helper()
	s, c, err := MemberTLS(creds)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

// handshake runs a TLS handshake between server and client over a pipe,
// then one byte each way, and returns each side's error. In TLS 1.3 the
// server checks the client's certificate after the client has finished,
// so a refused client sees the server's alert on its read.
func handshake(server, client *tls.Config) (serverErr, clientErr error) {
	// Kernel sockets, not net.Pipe: an alert must not wait for a reader.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err, err
	}
	defer l.Close()
	cc, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return err, err
	}
	defer cc.Close()
	sc, err := l.Accept()
	if err != nil {
		return err, err
	}
	defer sc.Close()
	deadline := time.Now().Add(5 * time.Second)
	_ = sc.SetDeadline(deadline)
	_ = cc.SetDeadline(deadline)
	done := make(chan error, 1)
	go func() {
		s := tls.Server(sc, server)
		err := s.Handshake()
		if err == nil {
			if _, err = s.Read(make([]byte, 1)); err == nil {
				_, err = s.Write([]byte{1})
			}
		}
		_ = sc.Close()
		done <- err
	}()
	c := tls.Client(cc, client)
	if clientErr = c.Handshake(); clientErr == nil {
		if _, clientErr = c.Write([]byte{1}); clientErr == nil {
			_, clientErr = c.Read(make([]byte, 1))
		}
	}
	_ = cc.Close()
	return <-done, clientErr
}

// certFor builds a client config presenting a certificate for key that
// carries token (forgeries and other roles' credentials).
func certFor(t *testing.T, token string, key ed25519.PrivateKey) *tls.Config {
	t.Helper()
	claims, err := jwt.DecodeUserClaims(token)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := memberCert(token, claims, key, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true, MinVersion: tls.VersionTLS13} //nolint:gosec // the attacker's side
}

func keyOf(t *testing.T, creds []byte) (string, ed25519.PrivateKey) {
	t.Helper()
	token, seed, _, err := ParseCreds(creds)
	if err != nil {
		t.Fatal(err)
	}
	_, raw, err := nkeys.DecodeSeed([]byte(seed))
	if err != nil {
		t.Fatal(err)
	}
	return token, ed25519.NewKeyFromSeed(raw)
}

// TestMemberTLS: members (and admins) of one authority complete the
// handshake both ways; a peer without a certificate, with an engine's
// credentials, another authority's, a member's JWT on its own key, a JWT
// it signed itself naming the account, or expired credentials does not.
func TestMemberTLS(t *testing.T) {
	a, other := newAuthority(t), newAuthority(t)
	m1 := mint(t, a, Identity{Role: RoleMember, Member: "m1"}, 0)
	s1, _ := memberPair(t, m1)
	_, c2 := memberPair(t, mint(t, a, Identity{Role: RoleMember, Member: "m2"}, 0))
	if se, ce := handshake(s1, c2); se != nil || ce != nil {
		t.Fatalf("member to member: server %v, client %v", se, ce)
	}
	_, cAdmin := memberPair(t, mint(t, a, Identity{Role: RoleAdmin}, 0))
	if se, ce := handshake(s1, cAdmin); se != nil || ce != nil {
		t.Fatalf("admin to member: server %v, client %v", se, ce)
	}

	engine := mint(t, a, Identity{Role: RoleEngine, Member: "m1", Engine: "e1"}, 0)
	if _, _, err := MemberTLS(engine); err == nil {
		t.Fatal("MemberTLS built a member identity from engine credentials")
	}
	engineTok, engineKey := keyOf(t, engine)
	m1Tok, _ := keyOf(t, m1)
	_, strangerKey, _ := ed25519.GenerateKey(rand.Reader)

	// A JWT the attacker signs with its own account key but which names
	// the authority's account as IssuerAccount.
	rogue, _ := nkeys.CreateAccount()
	strangerPub, _ := nkeys.Encode(nkeys.PrefixByteUser, strangerKey.Public().(ed25519.PublicKey))
	uc := jwt.NewUserClaims(string(strangerPub))
	uc.Tags.Add("connex-role:" + RoleMember)
	uc.IssuerAccount = a.AccountPublicKey()
	rogueTok, err := uc.Encode(rogue)
	if err != nil {
		t.Fatal(err)
	}

	expired := mint(t, a, Identity{Role: RoleMember, Member: "m3"}, time.Second)
	expiredTok, expiredKey := keyOf(t, expired)
	_, cOther := memberPair(t, mint(t, other, Identity{Role: RoleMember, Member: "m1"}, 0))

	refused := map[string]*tls.Config{
		"no certificate":      {InsecureSkipVerify: true, MinVersion: tls.VersionTLS13}, //nolint:gosec // the attacker's side
		"engine credentials":  certFor(t, engineTok, engineKey),
		"another authority":   cOther,
		"member JWT, own key": certFor(t, m1Tok, strangerKey),
		"self-signed JWT":     certFor(t, rogueTok, strangerKey),
	}
	for name, c := range refused {
		se, ce := handshake(s1, c)
		if se == nil {
			t.Errorf("%s: server accepted the peer (client %v)", name, ce)
		}
	}
	// Expiry is checked at each handshake, against the JWT.
	exp := certFor(t, expiredTok, expiredKey)
	poll.Until(t, 5*time.Second, 50*time.Millisecond, func() error {
		if se, _ := handshake(s1, exp); se == nil {
			return errors.New("expired credentials still accepted")
		}
		return nil
	})

	// The dialler refuses a server that is not a member either.
	sOther, _ := memberPair(t, mint(t, other, Identity{Role: RoleMember, Member: "m9"}, 0))
	_, c1 := memberPair(t, m1)
	if _, ce := handshake(sOther, c1); ce == nil || !strings.Contains(ce.Error(), "another authority") {
		t.Fatalf("member dialled another authority's server: %v", ce)
	}
}
