package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"github.com/connex/connex/auth"
	"github.com/connex/connex/config"
	"github.com/connex/connex/transport/tcp"
)

// dataTLS is the TCP data plane's TLS, so that only members of the
// cluster read KV bytes (or take a connection slot: slots are counted
// after the handshake) and no one on the path sees them. With data_tls on
// or auto: when the member has a NATS certificate and the cluster's CA,
// holders require readers' certificates signed by nats_tls_ca and readers
// verify holders' against it; otherwise, with member credentials (the
// default: nats_auth on), both sides present a certificate made from them
// and accept only members of the same authority (auth.MemberTLS, as the
// cluster's remote). Without either, plaintext.
func dataTLS(cfg config.Config, creds []byte) (tcp.Config, error) {
	if cfg.DataTLS == "off" {
		return tcp.Config{}, nil
	}
	if cfg.NATSTLSCert == "" || cfg.NATSTLSCA == "" {
		if len(creds) == 0 {
			if cfg.DataTLS == "on" {
				return tcp.Config{}, errors.New("data_tls=on: no nats_tls_cert/ca and no member credentials to make a certificate from")
			}
			return tcp.Config{}, nil
		}
		server, client, err := auth.MemberTLS(creds)
		if err != nil {
			return tcp.Config{}, fmt.Errorf("data_tls: %w", err)
		}
		return tcp.Config{ServerTLS: server, ClientTLS: client}, nil
	}
	cert, err := tls.LoadX509KeyPair(cfg.NATSTLSCert, cfg.NATSTLSKey)
	if err != nil {
		return tcp.Config{}, fmt.Errorf("data_tls: nats_tls_cert=%s nats_tls_key=%s: %w", cfg.NATSTLSCert, cfg.NATSTLSKey, err)
	}
	pem, err := os.ReadFile(cfg.NATSTLSCA)
	if err != nil {
		return tcp.Config{}, fmt.Errorf("data_tls: nats_tls_ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return tcp.Config{}, fmt.Errorf("data_tls: nats_tls_ca=%s holds no PEM certificate", cfg.NATSTLSCA)
	}
	return tcp.Config{
		ServerTLS: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS13},
		ClientTLS: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13},
	}, nil
}
