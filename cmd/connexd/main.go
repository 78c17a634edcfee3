// Command connexd is the Connex daemon: it holds prefill KV blocks under
// renewable leases and pulls them for decode, driven by engine shims over
// the NATS subject API (see README.md and ARCHITECTURE.md).
//
// With no nats_url it starts an embedded NATS server (JetStream under
// data_dir) and prints its client URL. Configuration: a YAML file
// (--config), CONNEX_* environment variables and flags; see --help.
//
// `connexd status [--nats-url URL] [--creds FILE] [--json]` prints every
// member's engines, holds, requests and pulls instead (see
// docs/operating.md); `connexd auth init|server-config|creds` manages the
// bus's authority and credentials (docs/security.md).
package main

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/connex/connex/config"
	"github.com/connex/connex/daemon"
	"github.com/spf13/pflag"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) > 0 && args[0] == "status" {
		return runStatus(args[1:], os.Stdout, os.Stderr)
	}
	if len(args) > 0 && args[0] == "auth" {
		return runAuth(args[1:], os.Stdout, os.Stderr)
	}
	cfg, err := config.Load(args, os.Environ())
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "connexd: %v\n", err)
		return 2
	}
	// Every line names this connexd, so that logs gathered from many
	// members tie together (with request, transfer and pull ids).
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: cfg.LogLevel})).With("connexd", cfg.MemberID)
	slog.SetDefault(log)
	if cfg.Role == "router" && os.Getenv("GOGC") == "" {
		// A router's live heap is small and every request allocates: at
		// Go's default the collector runs every few hundred requests (its
		// mark workers and assists were 6-8 % of the router's CPU at c=32
		// in make bench-router); at 400 it runs about a quarter as often.
		debug.SetGCPercent(cfg.RouterGOGC)
	}
	d, err := daemon.New(cfg, log)
	if err != nil {
		fmt.Fprintf(os.Stderr, "connexd: start: %v\n", err)
		return 1
	}
	// One line on stdout that scripts and tests can wait for.
	httpURL := ""
	if d.Router != nil {
		httpURL = " http=" + d.Router.URL()
	}
	if u := d.MetricsURL(); u != "" {
		httpURL += " metrics=" + u
	}
	if u := d.PprofURL(); u != "" {
		httpURL += " pprof=" + u
	}
	if dir := d.AuthDir(); dir != "" {
		httpURL += " auth=" + dir
	}
	fmt.Printf("connexd ready member=%s nats=%s backend=%s data=%s role=%s%s\n",
		d.MemberID(), d.Bus.URL, d.Backend.Name(), daemon.PrintableAddr(d.Backend.Address()), cfg.Role, httpURL)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	s := <-sig
	log.Info("shutting down", "signal", s.String())
	d.Close()
	fmt.Printf("connexd stopped member=%s\n", d.MemberID())
	return 0
}
