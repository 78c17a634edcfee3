package daemon

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"github.com/connex/connex/config"
	"github.com/connex/connex/transport/tcp"
)

// dataTLS is the TCP data plane's TLS: with data_tls on (or auto, when
// the member has a NATS certificate and the cluster's CA), holders require
// readers' certificates signed by nats_tls_ca and readers verify holders'
// against it, so only members of the cluster read KV bytes and no one on
// the path sees them.
func dataTLS(cfg config.Config) (tcp.Config, error) {
	if cfg.DataTLS == "off" || cfg.NATSTLSCert == "" || cfg.NATSTLSCA == "" {
		return tcp.Config{}, nil
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
