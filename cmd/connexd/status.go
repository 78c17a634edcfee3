package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/connex/connex/clusterstatus"
	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"
	"google.golang.org/protobuf/encoding/protojson"
)

// runStatus is `connexd status`: every member's engines, holds, requests
// and pulls, read over NATS.
func runStatus(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("connexd status", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	url := fs.String("nats-url", envOr("CONNEX_NATS_URL", "nats://127.0.0.1:4222"), "NATS server of the cluster")
	creds := fs.String("creds", os.Getenv("CONNEX_NATS_CREDS"), "NATS credentials file (default: "+credsDefault+" if it exists; connexd auth creds --role admin)")
	tlsCA := fs.String("nats-tls-ca", os.Getenv("CONNEX_NATS_TLS_CA"), "CA certificate (PEM) that verifies a TLS NATS server")
	asJSON := fs.Bool("json", false, "print the members' status as JSON lines (protojson) instead of tables")
	timeout := fs.Duration("timeout", 5*time.Second, "give up after this long")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: connexd status [--nats-url URL] [--creds FILE] [--nats-tls-ca FILE] [--json] [--timeout 5s]\n\n"+
			"Lists every member serving the connex API with its engines, live holds (oldest first),\n"+
			"in-flight requests and running pulls.\n\n"+
			"The defaults come from CONNEX_NATS_URL, CONNEX_NATS_CREDS and CONNEX_NATS_TLS_CA, as for connexd\n"+
			"itself: `. <env file>` with the file connex-up (make run) prints sets the first two.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == pflag.ErrHelp {
			return 0
		}
		return 2
	}
	opts := []nats.Option{nats.Name("connexd status"), nats.Timeout(*timeout)}
	if *creds == "" {
		if _, err := os.Stat(credsDefault); err == nil {
			*creds = credsDefault
		}
	}
	if *creds != "" {
		opts = append(opts, nats.UserCredentials(*creds))
	}
	if *tlsCA != "" {
		opts = append(opts, nats.RootCAs(*tlsCA))
	}
	nc, err := nats.Connect(*url, opts...)
	if err != nil {
		fmt.Fprintf(stderr, "connexd status: connect to %s: %v\n", *url, err)
		return 1
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	r, err := clusterstatus.Gather(ctx, nc, 300*time.Millisecond)
	if err != nil {
		fmt.Fprintf(stderr, "connexd status: %v\n", err)
		return 1
	}
	if *asJSON {
		for _, m := range r.Members {
			b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
			if err != nil {
				fmt.Fprintf(stderr, "connexd status: %v\n", err)
				return 1
			}
			fmt.Fprintln(stdout, string(b))
		}
		return 0
	}
	if err := clusterstatus.Render(stdout, r); err != nil {
		fmt.Fprintf(stderr, "connexd status: %v\n", err)
		return 1
	}
	return 0
}

func envOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}
