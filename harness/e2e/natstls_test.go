package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/auth"
	"github.com/connex/connex/messages"
	"github.com/nats-io/nats.go"
)

// selfSignedCert writes a self-signed certificate for 127.0.0.1 (its own
// CA) and its key, and returns their paths.
func selfSignedCert(t testing.TB) (cert, key string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "connex test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IsCA: true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cert, key = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(key, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// TestNATSOverTLS: a connexd whose embedded server serves TLS (and
// authenticates) is reached only by clients that verify its certificate;
// a second member joins over TLS with its own credentials, a pull between
// them crosses the TCP data plane with mutual TLS, and `connexd status`
// reads both.
func TestNATSOverTLS(t *testing.T) {
	cert, key := selfSignedCert(t)
	tlsArgs := []string{"--nats-tls-cert", cert, "--nats-tls-key", key, "--nats-tls-ca", cert}
	p := startConnexd(t, "tls-p", append([]string{"--backend", "tcp", "--role", "prefill", "--cluster-preset", "lan"}, tlsArgs...)...)
	if _, err := nats.Connect(p.natsURL, nats.UserCredentials(adminCreds(p.natsURL))); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("a client that does not trust the server's CA: %v, want a certificate error", err)
	}
	startConnexd(t, "tls-d", "--backend", "tcp", "--role", "decode", "--cluster-preset", "lan", "--nats-url", p.natsURL, "--nats-tls-ca", cert, "--nats-tls-cert", cert, "--nats-tls-key", key)
	nc := connect(t, p.natsURL)
	checkFor(t, 15*time.Second, 50*time.Millisecond, func() error {
		st, err := (&api.Client{NC: nc, Member: "tls-p"}).MemberStatus(ctx5(t), &messages.MemberStatusRequest{})
		if err != nil {
			return err
		}
		if !strings.Contains(strings.Join(st.ClusterMembers, ","), "tls-d") {
			return fmt.Errorf("tls-p sees %v", st.ClusterMembers)
		}
		return nil
	})
	// A pull between them crosses the TCP data plane with mutual TLS
	// (data_tls=auto: both have the cluster's certificate and CA).
	// connexd answers an engine-scoped call only on the calling engine's
	// inbox: the test's admin connections use each engine's inbox prefix.
	pre := newEngine(t, adminAsEngine(t, p.natsURL, "tls-p", "engP"), "tls-p", "engP", testLayout, true)
	dec := openDecodeShim(t, engineConn(t, p.natsURL, "tls-d", "engD"), "tls-d", "engD")
	h, err := pre.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pre.id, RegionId: pre.rid, BlockIds: []uint32{5, 6}, NumTokens: 32})
	if err != nil {
		t.Fatal(err)
	}
	done, err := dec.Pull(ctx5(t), h.Params, []uint32{1, 2})
	if err != nil || !done.Ok {
		t.Fatalf("a pull over the TLS data plane: %v %v", done, err)
	}
	verifyBlocks(t, pre.region, dec.Region(), []uint32{5, 6}, []uint32{1, 2}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, connexdBin, "status", "--nats-url", p.natsURL, "--creds", adminCreds(p.natsURL), "--nats-tls-ca", cert).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "tls-d") || !strings.Contains(string(out), "tls-p") {
		t.Fatalf("connexd status over TLS: %v\n%s", err, out)
	}
}

// adminAsEngine is an admin connection to url whose replies arrive on
// the inbox of engine on member, for calls the test makes in that engine's name (an
// admin may also call member-scoped endpoints an engine may not).
func adminAsEngine(t testing.TB, url, member, engine string) *nats.Conn {
	t.Helper()
	opts := []nats.Option{nats.CustomInboxPrefix(auth.Identity{Role: auth.RoleEngine, Member: member, Engine: engine}.InboxPrefix())}
	if f := adminCreds(url); f != "" {
		opts = append(opts, nats.UserCredentials(f))
	}
	return dial(t, url, opts...)
}
