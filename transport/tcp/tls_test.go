package tcp

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/connex/connex/transport"
)

// testCA makes a CA and a certificate it signs for 127.0.0.1.
func testCA(t testing.TB, name string) (*x509.CertPool, tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: name + " member"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return pool, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

func tlsConfigs(pool *x509.CertPool, cert tls.Certificate) Config {
	return Config{
		ServerTLS: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13},
		ClientTLS: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13},
	}
}

// TestTLSDataPlane: with TLS on both sides a Get reads the right bytes;
// a reader without a certificate, or with one of another CA, gets no byte
// and a clear error; a plaintext reader is dropped.
func TestTLSDataPlane(t *testing.T) {
	checkNoLeaks(t)
	pool, cert := testCA(t, "cluster")
	server := openBackend(t, tlsConfigs(pool, cert))
	mem := randomBytes(7, 1<<20)
	reg := register(t, server, mem)
	get := func(client *Backend) ([]byte, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		ep, err := client.Connect(ctx, server.Address())
		if err != nil {
			return nil, err
		}
		defer ep.Close()
		dst := make([]byte, len(mem))
		err = ep.Get(ctx, []transport.GetOp{{RemoteKey: reg.RemoteKey(), RemoteAddr: reg.RemoteAddr(), Dst: dst}})
		return dst, err
	}
	got, err := get(openBackend(t, tlsConfigs(pool, cert)))
	if err != nil || !bytes.Equal(got, mem) {
		t.Fatalf("a TLS Get: %v (equal %v)", err, bytes.Equal(got, mem))
	}
	noCert := tlsConfigs(pool, cert)
	noCert.ClientTLS.Certificates = nil
	otherPool, otherCert := testCA(t, "other")
	for name, cfg := range map[string]Config{
		"no client certificate": noCert,
		"another CA":            tlsConfigs(otherPool, otherCert),
		"plaintext":             {},
	} {
		got, err := get(openBackend(t, cfg))
		if err == nil {
			t.Fatalf("%s: Get succeeded", name)
		}
		if !errors.Is(err, transport.ErrPeerGone) {
			t.Fatalf("%s: %v, want ErrPeerGone", name, err)
		}
		if bytes.Contains(got, mem[:64]) {
			t.Fatalf("%s: bytes arrived", name)
		}
		t.Logf("%s: %v", name, err)
	}
}
