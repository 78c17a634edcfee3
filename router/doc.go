// Package router is Connex's OpenAI-compatible front door (connexd --role
// router). It speaks to engines exactly as vLLM's own P/D proxy does: the
// client's request goes to a prefill engine with max_tokens 1, stream false
// and kv_transfer_params {do_remote_decode: true}; the kv_transfer_params the
// prefill engine returns go with the client's request to a decode engine,
// whose stream is relayed to the client.
//
// The router is the one authority that decides where a request resumes.
// When the decode engine's stream breaks (the engine or its node died), stalls
// well beyond its inter-token time (frozen), answers 5xx, or the engine
// leaves the cluster's membership, the router resends the prompt plus the tokens the
// client already received, with the same kv_transfer_params and
// connex_resume set, to another decode engine as a /v1/completions request of
// token ids. That engine takes the request over (request.start with
// takeover: a new epoch fences the old activation), pulls the same hold
// again, recomputes only the k tokens, and continues; the client sees one
// unbroken stream. No second prefill happens while the hold lives.
//
// A request that cannot resume from the client's tokens (tools, reasoning,
// logprobs, penalties: resumable.go) is generated again from its first
// token when it is greedy or seeded (replay.go: the router seeds an
// unseeded sampled one at its first leg, seed.go), and refused otherwise.
//
// Decisions are pure and tested on their own: which engine (pick.go), when a
// stream counts as stalled (stall.go, the window from stallrule.go; scripts
// in testdata/stall/), what a leg's end calls for (resumemachine.go: done,
// reject, resume by prefix or by replay, refuse, too many resumes; scripts
// in testdata/resume/), what each leg's body is (legs.go,
// built only from the client fields body.go accepts: clients are not
// trusted). server.go, relay.go and decodeleg.go only wire them to HTTP; auth.go (API and
// admin keys) and limits.go (timeouts, connection cap, admission) guard it.
package router
