// Command connex-chaos runs a chaos scenario against a real local Connex
// cluster — clients → router → simulated engines → connexd → NATS, every
// one its own OS process — and checks the invariants of a disaggregated
// serving system that survives decode failures without a second prefill:
// nothing lost, no second prefill while the hold was alive, outputs equal
// to the uninterrupted reference, no leaked prefill blocks, exactly-once
// free.
//
//	connex-chaos [--report FILE.json] [--plot FILE.png] [--connexd PATH] SCENARIO.yaml
//
// It exits 0 when every invariant held, 1 when one broke (the message names
// the invariant, the requests and what differed), 2 on a bad scenario or a
// setup failure. Scenarios: harness/chaos/scenarios/ (docs/chaos.md "Chaos-test
// harness").
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/connex/connex/harness/chaos"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/pflag"
	"golang.org/x/term"
)

func main() {
	chaos.ServeNATSIfAsked()
	chaos.BurnIfAsked()
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("connex-chaos", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	report := fs.String("report", "", "write the JSON report here")
	plotPath := fs.String("plot", "", "write the PNG timeline here")
	connexd := fs.String("connexd", "./bin/connexd", "connexd binary (connex-sim must sit beside it)")
	verbose := fs.Bool("verbose", false, "print every process's output")
	logLevel := fs.String("log-level", "warn", "every process's --log-level (with --verbose)")
	var extra []string
	fs.StringArrayVar(&extra, "connexd-arg", nil, "an extra flag for every connexd (repeatable), for experiments")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: connex-chaos [--report FILE.json] [--plot FILE.png] [--connexd PATH] SCENARIO.yaml")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return 2
	}
	path := fs.Arg(0)
	data, err := os.ReadFile(path)
	if err != nil {
		fmt.Fprintf(stderr, "connex-chaos: %v\n", err)
		return 2
	}
	sc, err := chaos.ParseScenario(data)
	if err != nil {
		fmt.Fprintf(stderr, "connex-chaos: %s: %v\n", path, err)
		return 2
	}
	if sc.Name == "" {
		sc.Name = filepath.Base(path)
	}
	opts := chaos.Options{Connexd: *connexd, ConnexdArgs: extra, LogLevel: *logLevel}
	if *verbose {
		opts.Log = stderr
	}
	if f, ok := stderr.(*os.File); ok && term.IsTerminal(int(f.Fd())) && !*verbose {
		bar := progressbar.NewOptions(sc.Load.Requests,
			progressbar.OptionSetWriter(stderr),
			progressbar.OptionSetDescription("requests"),
			progressbar.OptionShowCount(),
			progressbar.OptionSetElapsedTime(true),
			progressbar.OptionClearOnFinish(),
		)
		opts.Progress = func(p chaos.Progress) {
			bar.Describe(fmt.Sprintf("in flight %d, failed %d, faults %d", p.InFlight, p.Failed, p.Faults))
			_ = bar.Set(p.Done)
		}
		defer func() { _ = bar.Finish() }()
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := chaos.Run(ctx, sc, opts)
	if err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(stderr, "connex-chaos: interrupted; every process it started has been stopped")
			return 2
		}
		fmt.Fprintf(stderr, "connex-chaos: %v\n", err)
		return 2
	}
	if *report != "" {
		if err := rep.WriteJSON(*report); err != nil {
			fmt.Fprintf(stderr, "connex-chaos: %v\n", err)
			return 2
		}
	}
	if *plotPath != "" {
		if err := rep.WritePlot(*plotPath); err != nil {
			fmt.Fprintf(stderr, "connex-chaos: %v\n", err)
			return 2
		}
	}
	rep.WriteTable(stdout)
	if !rep.OK() {
		return 1
	}
	return 0
}
