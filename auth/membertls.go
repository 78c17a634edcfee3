package auth

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/asn1"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nkeys"
)

// A member's TLS identity on protoactor's remote is its NATS credentials:
// the certificate is self-signed with the credentials' user key (an
// Ed25519 nkey) and carries the user JWT, which the authority's account
// key signed. A peer accepts it when the JWT verifies, names that very key
// as its subject, was issued by the peer's own account, carries the member
// (or admin) role and has not expired; TLS 1.3 proves the key is held. So
// the authority is the CA without a second PKI to run, and every member
// that has credentials (embedded server or `connexd auth creds --role
// member`) has a certificate; an engine's credentials, or none, cannot
// complete the handshake.

// memberJWTOID is the certificate extension holding the user JWT. It is
// not a registered enterprise number: a private, non-critical extension
// read only by MemberTLS peers.
var memberJWTOID = asn1.ObjectIdentifier{1, 3, 6, 1, 4, 1, 59999, 7, 1}

// ErrNotMember means a TLS peer's certificate does not prove member
// credentials of this cluster's authority.
var ErrNotMember = errors.New("auth: peer is not a member")

// MemberTLS builds mutual TLS 1.3 configs from member (or admin)
// credentials: server requires a client certificate and client presents
// one, and each side accepts only a peer whose certificate proves member
// or admin credentials signed by the same account (see memberJWTOID).
// Host names are not checked: any member may dial any other by address.
func MemberTLS(creds []byte) (server, client *tls.Config, err error) {
	token, seed, claims, err := ParseCreds(creds)
	if err != nil {
		return nil, nil, err
	}
	if !peerRole(claims) {
		return nil, nil, fmt.Errorf("auth: member TLS: credentials of %q are not a member's or an admin's", claims.Name)
	}
	_, raw, err := nkeys.DecodeSeed([]byte(seed))
	if err != nil {
		return nil, nil, fmt.Errorf("auth: member TLS: seed: %w", err)
	}
	key := ed25519.NewKeyFromSeed(raw)
	cert, err := memberCert(token, claims, key, time.Now())
	if err != nil {
		return nil, nil, err
	}
	account := issuerAccount(claims)
	if account == "" {
		return nil, nil, fmt.Errorf("auth: member TLS: credentials of %q are signed by a signing key, not the account's own", claims.Name)
	}
	verify := func(rawCerts [][]byte, _ [][]*x509.Certificate) error {
		return verifyMemberCert(rawCerts, account, time.Now())
	}
	server = &tls.Config{
		Certificates:          []tls.Certificate{cert},
		ClientAuth:            tls.RequireAnyClientCert, // verified by verify, not by a CA pool
		VerifyPeerCertificate: verify,
		MinVersion:            tls.VersionTLS13,
	}
	client = &tls.Config{
		Certificates: []tls.Certificate{cert},
		// No CA chain or host name to check: verify checks the authority's
		// signature on the JWT inside the certificate instead.
		InsecureSkipVerify:    true, //nolint:gosec // replaced by VerifyPeerCertificate
		VerifyPeerCertificate: verify,
		MinVersion:            tls.VersionTLS13,
	}
	return server, client, nil
}

// memberCert self-signs a certificate for key carrying token, valid until
// the credentials expire (or for ten years when they do not).
func memberCert(token string, claims *jwt.UserClaims, key ed25519.PrivateKey, now time.Time) (tls.Certificate, error) {
	ext, err := asn1.MarshalWithParams(token, "utf8")
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("auth: member TLS: encode JWT: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("auth: member TLS: serial: %w", err)
	}
	notAfter := now.AddDate(10, 0, 0)
	if claims.Expires > 0 {
		notAfter = time.Unix(claims.Expires, 0)
	}
	tmpl := &x509.Certificate{
		SerialNumber:    serial,
		Subject:         pkix.Name{CommonName: claims.Name},
		NotBefore:       now.Add(-time.Hour), // tolerate peers' clock skew
		NotAfter:        notAfter,
		KeyUsage:        x509.KeyUsageDigitalSignature,
		ExtKeyUsage:     []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		ExtraExtensions: []pkix.Extension{{Id: memberJWTOID, Value: ext}},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("auth: member TLS: certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}

// verifyMemberCert accepts a peer's leaf certificate only if it carries a
// user JWT issued by account, for the certificate's own Ed25519 key, with
// a member or admin role, valid at now.
func verifyMemberCert(rawCerts [][]byte, account string, now time.Time) error {
	if len(rawCerts) == 0 {
		return fmt.Errorf("%w: no certificate", ErrNotMember)
	}
	cert, err := x509.ParseCertificate(rawCerts[0])
	if err != nil {
		return fmt.Errorf("%w: certificate: %v", ErrNotMember, err)
	}
	pub, ok := cert.PublicKey.(ed25519.PublicKey)
	if !ok {
		return fmt.Errorf("%w: certificate key is not Ed25519", ErrNotMember)
	}
	var token string
	for _, e := range cert.Extensions {
		if e.Id.Equal(memberJWTOID) {
			if _, err := asn1.UnmarshalWithParams(e.Value, &token, "utf8"); err != nil {
				return fmt.Errorf("%w: JWT extension: %v", ErrNotMember, err)
			}
		}
	}
	if token == "" {
		return fmt.Errorf("%w: certificate carries no credentials", ErrNotMember)
	}
	claims, err := jwt.DecodeUserClaims(token) // checks the issuer's signature
	if err != nil {
		return fmt.Errorf("%w: JWT: %v", ErrNotMember, err)
	}
	subject, err := nkeys.Encode(nkeys.PrefixByteUser, pub)
	if err != nil {
		return fmt.Errorf("%w: certificate key: %v", ErrNotMember, err)
	}
	switch {
	case issuerAccount(claims) != account:
		return fmt.Errorf("%w: credentials of another authority", ErrNotMember)
	case claims.Subject != string(subject):
		return fmt.Errorf("%w: credentials of another key", ErrNotMember)
	case !peerRole(claims):
		return fmt.Errorf("%w: %q is not a member", ErrNotMember, claims.Name)
	case claims.Expires > 0 && now.Unix() > claims.Expires:
		return fmt.Errorf("%w: credentials of %q expired", ErrNotMember, claims.Name)
	case claims.NotBefore > 0 && now.Unix() < claims.NotBefore:
		return fmt.Errorf("%w: credentials of %q not valid yet", ErrNotMember, claims.Name)
	}
	return nil
}

// peerRole reports whether claims may join the cluster's remote: members,
// and admins (connexd accepts admin credentials as nats_creds).
func peerRole(claims *jwt.UserClaims) bool {
	return claims.Tags.Contains("connex-role:"+RoleMember) || claims.Tags.Contains("connex-role:"+RoleAdmin)
}

// issuerAccount is the account key that signed claims. The authority signs
// with the account key itself; a JWT signed by a signing key that only
// names an account (IssuerAccount) proves nothing without that account's
// JWT, so it gets no account here.
func issuerAccount(claims *jwt.UserClaims) string {
	if claims.IssuerAccount != "" && claims.IssuerAccount != claims.Issuer {
		return ""
	}
	return claims.Issuer
}
