package router

import (
	"cmp"
	"slices"

	"github.com/connex/connex/messages"
)

// Engine is one engine a router may send a leg to, as membership advertises it.
type Engine struct {
	// Member is the connexd member the engine is registered with.
	Member string
	// Info is the engine's registration.
	Info *messages.EngineInfo
	// Suspect is true while its member is silent and being probed.
	Suspect bool
}

// Pick chooses the engine of role serving model with the least load:
// fewest requests in flight (as advertised plus what this router has sent
// it since, busy), then most free blocks, then by engine id so that the
// choice is deterministic. Engines in skip are never chosen. ok is false
// when no engine qualifies.
//
// A suspect engine (its member silent, being probed, not yet gone) is
// chosen only when no other qualifies: suspicion is a hint, not a verdict,
// and on a CPU-starved machine every member can be late at once. Sending
// the leg there costs at worst a failed leg that resumes elsewhere or a
// clear error; refusing it would answer no_engine while the engine lives.
func Pick(engines []Engine, role, model string, busy map[string]int, skip map[string]bool) (Engine, bool) {
	var cands, suspects []Engine
	for _, e := range engines {
		if e.Info.GetRole() != role || e.Info.GetModel() != model || skip[e.Info.GetEngineId()] {
			continue
		}
		if e.Suspect {
			suspects = append(suspects, e)
		} else {
			cands = append(cands, e)
		}
	}
	if len(cands) == 0 {
		cands = suspects
	}
	if len(cands) == 0 {
		return Engine{}, false
	}
	load := func(e Engine) int { return int(e.Info.GetInFlight()) + busy[e.Info.GetEngineId()] }
	return slices.MinFunc(cands, func(a, b Engine) int {
		return cmp.Or(
			cmp.Compare(load(a), load(b)),
			cmp.Compare(b.Info.GetBlocksFree(), a.Info.GetBlocksFree()),
			cmp.Compare(a.Info.GetEngineId(), b.Info.GetEngineId()),
		)
	}), true
}

// Models lists the distinct models the engines serve, sorted, with whether
// each has both a prefill and a decode engine (servable).
func Models(engines []Engine) (all []string, servable map[string]bool) {
	roles := map[string]map[string]bool{}
	for _, e := range engines {
		m := e.Info.GetModel()
		if roles[m] == nil {
			roles[m] = map[string]bool{}
			all = append(all, m)
		}
		roles[m][e.Info.GetRole()] = true
	}
	slices.Sort(all)
	servable = map[string]bool{}
	for m, r := range roles {
		servable[m] = r["prefill"] && r["decode"]
	}
	return all, servable
}

// Has reports whether engine id is among engines.
func Has(engines []Engine, id string) bool {
	return slices.ContainsFunc(engines, func(e Engine) bool { return e.Info.GetEngineId() == id })
}
