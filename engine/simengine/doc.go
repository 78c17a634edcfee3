// Package simengine is connex-sim's deterministic simulated inference engine: an
// OpenAI-compatible HTTP server in the shape of `vllm serve` whose "model"
// is a pure function, so that a request resumed on another engine gives the
// same answer as an uninterrupted one.
//
// Toy tokenizer. A prompt string is its UTF-8 bytes, one token per byte
// (ids 0–255). Chat messages render as "<|role|>\ncontent\n" per message,
// then "<|assistant|>\n", then bytes. Output tokens have ids ≥ 256
// (OutputBase) and detokenize to a fixed vocabulary of short words with a
// leading space (Vocab), so the text of a sequence is the concatenation of
// its tokens' texts: streamed text equals non-streamed text.
//
// KV. Position p of a sequence carries a prefix hash h_p of tokens 0..p
// (so KV depends on everything before it, as a transformer's does). Its KV
// in layer l, K or V (k), head h of the model is one vector of head_size
// elements inside block blocks[p/block_size] of the region of every TP rank
// that holds head h, at the place the layout's in-block order gives it
// (kvmem.Layout.ElementAt), filled with 64-bit words seed+i·φ where seed =
// mix(h_p, l, k, h) | 1 (never zero), whatever the engine's shape.
// Verification reads the first word of one head (each in turn) at every
// 16th position in every layer and K/V, and of every head at the last
// loaded position, in every rank that holds it, which detects a wrong
// block, a block of another request (another prefix), a misplaced head and
// an unwritten (zero) block, in a few ms for 1 GiB.
//
// Output. Every sampled word read from the regions is folded into a digest
// (a commutative sum, so order does not matter); the next token is a pure
// function of that digest, the prefix hash of the tokens so far and the
// position. A generated token's KV is written and folded in too. So the
// output depends on the KV contents as read from the region, and equals
// across engines whenever the KV does.
package simengine
