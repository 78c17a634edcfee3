// Command connex-chaos runs Connex's chaos-test harness: a real
// multi-process cluster (NATS, a prefill connexd, decode connexd processes)
// on this machine, a request load driven by deterministic engines, and
// SIGKILL/SIGSTOP faults on decode members, then checks the invariants
// (nothing lost, no second prefill, same answer, no leaked blocks,
// exactly-once free). It exits 1 if any invariant broke.
//
//	connex-chaos --connexd ./bin/connexd --requests 100 --chaos 2s
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/connex/connex/chaos"
)

func main() {
	cfg := chaos.DefaultConfig()
	flag.StringVar(&cfg.Binary, "connexd", "./bin/connexd", "connexd binary to run")
	flag.StringVar(&cfg.Backend, "backend", cfg.Backend, "data plane of every member: tcp or ucx")
	flag.StringVar(&cfg.Regions, "regions", cfg.Regions, "engines' KV regions: create (region.create) or file (region.register)")
	flag.IntVar(&cfg.Decoders, "decoders", cfg.Decoders, "decode members kept alive (≥ 2)")
	flag.IntVar(&cfg.Requests, "requests", cfg.Requests, "requests to drive")
	flag.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "requests in flight")
	flag.IntVar(&cfg.Tokens, "tokens", cfg.Tokens, "tokens per request")
	flag.IntVar(&cfg.Every, "every", cfg.Every, "tokens per checkpoint")
	flag.DurationVar(&cfg.TokenTime, "token-time", cfg.TokenTime, "simulated decode time per token")
	flag.DurationVar(&cfg.Chaos, "chaos", cfg.Chaos, "interval between faults (0 = none)")
	flag.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed for faults and content")
	quiet := flag.Bool("quiet", false, "print only the report")
	flag.Parse()
	if !*quiet {
		cfg.Log = os.Stderr
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rep, err := chaos.Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "connex-chaos:", err)
		os.Exit(2)
	}
	fmt.Println(rep)
	if !rep.OK() {
		os.Exit(1)
	}
}
