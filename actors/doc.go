// Package actors wires Connex's decisions to protoactor-go actors.
//
// HoldSupervisor is the prefill-side supervisor: it spawns one Hold actor per
// transfer. A Hold actor owns its transfer's data-plane registrations and
// lease timer and turns messages and timer ticks into Steps of the pure
// lease.Hold state machine, performing the effects it returns (deregister,
// free the blocks, notify the engine). A puller runs one pull on the decode
// side, as a plain goroutine (nothing but its own results would reach a
// mailbox): it performs the effects of the pure pullMachine, which decides
// when to ask the holding member for descriptors again, when to give up,
// when to read the bytes with the transport, renew the lease and end the
// pull on the holder, and what the outcome is. Nothing here decides anything that lease or kvmem could decide.
package actors
