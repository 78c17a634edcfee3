// Package localcluster starts a local prefill/decode Connex cluster as
// separate OS processes, the way a user would: one connexd with
// `--role router` (embedding NATS unless Options.NATSURL names a server) and,
// for every engine, a connexd bound to it plus a connex-sim engine that talks
// to that connexd over the NATS subject API.
//
// Names: the router is "router"; engines are "prefill-<i>" and "decode-<i>"
// (i from 0), and each engine's connexd uses that name as its member id and
// the engine as its engine id. A target names processes: "router",
// "decode-1/engine" (the connex-sim), "decode-1/connexd", or a bare
// "decode-1" for both.
//
// It is used by `make run` (cmd/connex-up), the end-to-end tests, the resume
// benchmark and the chaos harness. It builds nothing except through Build;
// every process it starts dies with it (SIGTERM on Close, SIGKILL after a
// deadline, and on Linux a parent-death signal).
package localcluster
