// Package pull is the decode side of a transfer: reading a hold's KV blocks
// from the member that holds them into a local region.
//
// StartPuller runs one pull as a plain goroutine (nothing but its own
// results would reach a mailbox): it performs the effects of the pure
// pullMachine (pullmachine.go, scripted in testdata/pull/), which decides
// when to ask the holding member for descriptors again, when to give up,
// when to read the bytes with the transport, renew the lease and end the
// pull on the holder, and what the outcome is. Read planning is pure too:
// planDst and bind (readplan.go) turn the hold's descriptors into reads of
// whole blocks between regions of one shape, planTranslated
// (translatedplan.go, with kvmem's translations cached in translations.go)
// into the pieces a change of TP size, block size or in-block order needs.
// stallWatch fails reads that stop making progress; HolderWatch ends the
// pulls from a member that left the cluster. The hold side (the holder's
// actors) is package actors.
package pull
