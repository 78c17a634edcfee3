// Command connexd is the Connex daemon.
package main

import (
	_ "github.com/asynkron/protoactor-go/actor"
	_ "github.com/asynkron/protoactor-go/cluster"
	_ "github.com/asynkron/protoactor-go/remote"
	_ "github.com/nats-io/nats-server/v2/server"
	_ "github.com/nats-io/nats.go"
	_ "github.com/nats-io/nats.go/micro"
	_ "github.com/spf13/viper"
	_ "google.golang.org/protobuf/proto"
)

func main() {}
