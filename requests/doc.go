// Package requests decides what happens to in-flight decode requests: their
// durable state, who may write it (fencing by epoch and compare-and-set),
// and where an orphaned request goes when its member dies (placement by
// load). Pure functions plus a Store interface; the JetStream KV store is
// the production implementation and actors only wire these.
//
// The orphan coordinator is here too: Adoptions and Leftovers decide (pure,
// adoption.go), and Coordinator (coordinator.go) is the loop every member
// runs, on membership changes and a ticker, with membership, the store and
// the adopt calls injected; the daemon wires them to the cluster and the
// subject API.
package requests
