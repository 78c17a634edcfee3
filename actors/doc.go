// Package actors wires Connex's decisions to protoactor-go actors.
//
// HoldSupervisor is the prefill-side supervisor: it spawns one Hold actor
// per transfer, and HoldTable lists the live ones (and, for a while, the
// ended ones). A Hold actor owns its transfer's data-plane registrations and
// lease timer and turns messages and timer ticks into Steps of the pure
// lease.Hold state machine, performing the effects it returns (deregister,
// free the blocks, notify the engine). The request actor applies the pure
// requests/activation core's effects on the decode side. The decode side of
// a transfer, the puller, is package pull. Nothing here decides anything
// that lease, kvmem or requests could decide.
package actors
