package e2e

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// The NATS floor of a pull (the reference of make bench-pull's BREAKDOWN
// lines): a pull's critical path is four NATS messages between three
// processes — the engine's pull.start to its connexd (the reader), the
// reader's peer.descriptors to the holder's connexd, the holder's answer,
// the reader's pull.done to the engine — each through the NATS server, which
// in the bench lives in the bench process beside the engine. floorRelay
// plays the reader and the holder as bare NATS responders in two OS
// processes of their own (this test binary, started again with
// relayEnv set) that do nothing but pass the messages on, so the chain's
// time, measured as the pulls are (caches scrubbed before each), is what
// no change to connexd's request path can get under on this machine.
// runFloorRelay also plays the micro and api relays of the layer probes
// (pull_bench_layers_test.go).

// relayEnv, when set in a process's environment to "<role> <nats url>",
// makes TestMain run that role of the floor relay instead of the tests.
const relayEnv = "CONNEX_E2E_FLOOR_RELAY"

// floor relay subjects.
const (
	floorStart = "bench.floor.start" // engine → reader (answered at once, like pull.start)
	floorDesc  = "bench.floor.desc"  // reader → holder (answered, like peer.descriptors)
	floorDone  = "bench.floor.done"  // reader → engine (like pull.done)
	// floorAPI is the engine API's own floor: pull.start answered and
	// pull.done sent at once, with no holder in between — the two messages
	// every pull through the NATS subject API pays, whatever carries the
	// descriptors.
	floorAPI = "bench.floor.api"
)

// runFloorRelay runs one relay role until stdin closes (the bench's end);
// it prints "relay ready" once subscribed.
func runFloorRelay(spec string) int {
	role, url, ok := strings.Cut(spec, " ")
	if !ok {
		fmt.Fprintf(os.Stderr, "%s=%q: want \"<role> <nats url>\"\n", relayEnv, spec)
		return 2
	}
	nc, err := nats.Connect(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 1
	}
	defer nc.Close()
	switch role {
	case "holder":
		_, err = nc.Subscribe(floorDesc, func(m *nats.Msg) {
			_ = m.Respond(m.Data)
		})
	case "reader":
		_, err = nc.Subscribe(floorAPI, func(m *nats.Msg) {
			_ = m.Respond(nil)
			_ = nc.Publish(floorDone, m.Data)
		})
		if err != nil {
			break
		}
		_, err = nc.Subscribe(floorStart, func(m *nats.Msg) {
			_ = m.Respond(nil)
			if _, err := nc.Request(floorDesc, m.Data, 5*time.Second); err != nil {
				fmt.Fprintln(os.Stderr, "relay desc:", err)
				return
			}
			_ = nc.Publish(floorDone, m.Data)
		})
	case "micro":
		err = serveMicroLayer(nc)
	case "api":
		err = serveAPILayer(nc)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "relay:", err)
		return 1
	}
	fmt.Println("relay ready")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n') // EOF when the bench ends
	return 0
}

// startFloorRelay starts role in a process of its own and waits until it
// is subscribed; it ends with the benchmark.
func startFloorRelay(b *testing.B, role, url string) {
	b.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), relayEnv+"="+role+" "+url)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = stdin.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "relay ready") {
		b.Fatalf("floor relay %s did not start: %q %v", role, line, err)
	}
}

// natsFloor runs the chain through the holder and reader relay processes
// (and, with BENCH_PULL_API_LAYERS=1, starts the micro and api relays the
// layer probes call).
type natsFloor struct {
	nc   *nats.Conn
	done chan struct{}
}

// startNATSFloor starts the relays on the server at url; they end with the
// benchmark.
func startNATSFloor(b *testing.B, url string) *natsFloor {
	b.Helper()
	startFloorRelay(b, "holder", url)
	startFloorRelay(b, "reader", url)
	if apiLayersOn() {
		startFloorRelay(b, "micro", url)
		startFloorRelay(b, "api", url)
	}
	f := &natsFloor{nc: connect(b, url), done: make(chan struct{}, 1)}
	sub, err := f.nc.Subscribe(floorDone, func(*nats.Msg) { f.done <- struct{}{} })
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := f.nc.Flush(); err != nil {
		b.Fatal(err)
	}
	f.chain(b) // warm-up
	f.apiChain(b)
	return f
}

// chain is the time of one four-message chain, after scrubCaches as a
// pull is: the bench interleaves one with every small pull, so both see
// the same machine (a shared VM's speed drifts by tens of percent within
// a minute).
func (f *natsFloor) chain(b *testing.B) time.Duration {
	b.Helper()
	return f.run(b, floorStart)
}

// apiChain is the time of the engine API's two-message chain (floorAPI),
// after scrubCaches, run beside chain.
func (f *natsFloor) apiChain(b *testing.B) time.Duration {
	b.Helper()
	return f.run(b, floorAPI)
}

func (f *natsFloor) run(b *testing.B, start string) time.Duration {
	b.Helper()
	scrubCaches()
	t0 := time.Now()
	if _, err := f.nc.Request(start, []byte("x"), 5*time.Second); err != nil {
		b.Fatalf("floor start: %v", err)
	}
	select {
	case <-f.done:
	case <-time.After(5 * time.Second):
		b.Fatal("floor: no done within 5s")
	}
	return time.Since(t0)
}
