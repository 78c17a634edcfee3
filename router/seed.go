package router

import (
	"encoding/json"
	"strconv"
)

// A chat with tools, a chat on an engine that runs a reasoning parser, a
// request with logprobs, output penalties or bad words: none resumes as a
// completion of its generated tokens (resumeRefusal), so such a request
// resumes by replay, which draws the same tokens again only when the
// request is greedy or seeded (replayable). A sampled request the client
// sent without a seed would be refused at its first failure. The router
// gives such a request a seed of its own when its first decode leg is sent:
// a fresh random seed for each request draws from the same distribution as
// no seed (vLLM then samples the request with a generator of its own), and
// the replay draws the tokens the client has. The answer's connex record
// (a non-streamed answer's, or a stream's usage chunk's) says the seed, so
// the request can be sent again with it.

// needsSeed reports whether the router should seed request c before its
// first decode leg on an engine whose reasoning parser is parser ("" for
// none): c samples without a seed and would not resume as a completion.
// Pure.
func needsSeed(c *ClientRequest, parser string) bool {
	if replayable(c) {
		return false
	}
	reason, _ := resumeRefusal(c, false, parser)
	return reason != ""
}

// seedRange bounds an assigned seed to 53 bits, which every JSON reader
// holds exactly (vLLM accepts any 64-bit integer).
const seedRange = 1 << 53

// assignSeed sets c's seed to draw % seedRange and returns it.
func assignSeed(c *ClientRequest, draw uint64) int64 {
	seed := int64(draw % seedRange)
	c.Body["seed"] = json.RawMessage(strconv.AppendInt(nil, seed, 10))
	return seed
}
