// Package actors wires Connex's decisions to protoactor-go actors.
//
// HoldTable is the prefill-side supervisor: it spawns one Hold actor per
// transfer. A Hold actor owns its transfer's data-plane registrations and
// lease timer and turns messages and timer ticks into Steps of the pure
// lease.Hold state machine, performing the effects it returns (deregister,
// free the blocks, notify the engine). A Puller actor runs one pull on the
// decode side: it asks the holding member for descriptors, reads the bytes
// with the transport, renews the lease during long reads and reports the
// outcome. Nothing here decides anything that lease or kvmem could decide.
package actors
