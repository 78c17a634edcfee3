package cluster

import "github.com/asynkron/protoactor-go/remote"

// endpointWriterQueueSize is the initial size of each peer's outbound
// queue. protoactor's default, 1,000,000, allocates 16 MB of pointer slots
// per peer connection up front, which the GC scans on every cycle; the
// queue grows on demand, so a small start costs nothing.
const endpointWriterQueueSize = 1024

// NewRemoteConfig is protoactor's remote.Configure(host, port, opts...)
// with two defaults changed. MaxRetryCount is 1 instead of 5: protoactor
// sleeps 2 s after every failed dial, so its default stalls messages to a
// dead member for about 10 s; membership, not dial retries, decides who is
// alive (0 is not allowed: protoactor then treats "never dialled" as
// connected). EndpointWriterQueueSize starts at 1024 instead of 1,000,000
// (see endpointWriterQueueSize).
func NewRemoteConfig(host string, port int, opts ...remote.ConfigOption) *remote.Config {
	c := remote.Configure(host, port, opts...)
	c.MaxRetryCount = 1
	c.EndpointWriterQueueSize = endpointWriterQueueSize
	return c
}
