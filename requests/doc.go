// Package requests decides what happens to in-flight decode requests: their
// durable state, who may write it (fencing by epoch and compare-and-set),
// and where an orphaned request goes when its member dies (placement by
// load). Pure functions plus a Store interface; the JetStream KV store is
// the production implementation and actors only wire these.
package requests
