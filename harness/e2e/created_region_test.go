package e2e

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

// TestCreatedRegion: an engine asks its connexd to create its KV region
// (region.create) and maps the returned path; a decode-side connexd pulls
// held blocks from it. With UCX the memory is UCX's POSIX shared memory and
// the pull is one-sided; with TCP it is a memfd. Every byte is verified.
func TestCreatedRegion(t *testing.T) {
	for _, backend := range backends() {
		t.Run(backend, func(t *testing.T) { createdRegion(t, backend) })
		if backend == "ucx" {
			// The reader posts ucp_get_nbx on its owner thread instead of
			// copying from the mapping itself.
			t.Run("ucx-shared-reads-get", func(t *testing.T) { createdRegion(t, backend, "--ucx-shared-reads", "get") })
		}
	}
}

// createdRegion runs the test on backend; readerArgs go to the decode-side
// connexd.
func createdRegion(t *testing.T, backend string, readerArgs ...string) {
	// A region quota above the machine's memory, so that the memory check
	// answers the 1 TiB region below (the quota's own answer, 429, is
	// TestQuotasAnswerOverloaded's).
	pn := startConnexd(t, "prefill", "--backend", backend, "--region-max-bytes", "2199023255552")
	startConnexd(t, "decode", append([]string{"--backend", backend, "--nats-url", pn.natsURL}, readerArgs...)...)
	nc := connect(t, pn.natsURL)
	pe, info := newCreatedEngine(t, nc, "prefill", "engP", testLayout, true)
	de := newEngine(t, nc, "decode", "engD", testLayout, false)
	want := map[string]string{"ucx": "ucx-shared", "tcp": "memfd"}[backend]
	if info.Memory != want || !strings.HasPrefix(info.Path, "/proc/") || info.Bytes != testLayout.Size() || info.BlocksFree != testLayout.Blocks {
		t.Fatalf("created region: memory %q (want %q), path %q, %d bytes, %d free blocks", info.Memory, want, info.Path, info.Bytes, info.BlocksFree)
	}
	layout := &messages.Layout{NumLayers: testLayout.Layers, KvPlanes: testLayout.Planes, NumBlocks: testLayout.Blocks,
		BlockBytes: testLayout.BlockBytes, BlockSize: testLayout.BlockSize, TpSize: testLayout.TPSize}
	// Creating it again is idempotent; another layout under the same id is refused.
	again, err := pe.cli.CreateRegion(ctx5(t), &messages.CreateRegionRequest{EngineId: pe.id, RegionId: pe.rid, Layout: layout})
	if err != nil || again.Path != info.Path {
		t.Fatalf("create again: %v, path %q want %q", err, again.GetPath(), info.Path)
	}
	other := proto.Clone(layout).(*messages.Layout)
	other.NumBlocks++
	_, err = pe.cli.CreateRegion(ctx5(t), &messages.CreateRegionRequest{EngineId: pe.id, RegionId: pe.rid, Layout: other})
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Code != api.CodeBadRequest {
		t.Fatalf("create with another layout: %v, want code %d", err, api.CodeBadRequest)
	}

	// More memory than the machine has: a clear error, nothing allocated.
	huge := &messages.Layout{NumLayers: 1024, KvPlanes: 2, NumBlocks: 1 << 10, BlockBytes: 1 << 19, BlockSize: 16, TpSize: 1} // 1 TiB
	_, err = pe.cli.CreateRegion(ctx5(t), &messages.CreateRegionRequest{EngineId: pe.id, RegionId: "huge", Layout: huge})
	if !errors.As(err, &ae) || ae.Code != api.CodeRegionIO || !strings.Contains(ae.Msg, "not enough shared memory") {
		t.Fatalf("create a 1 TiB region: %v, want code %d", err, api.CodeRegionIO)
	}

	done := subscribe(t, nc, api.PullDoneSubject(de.cli.Member, de.id), func() *messages.PullDone { return new(messages.PullDone) })
	src := []uint32{3, 4, 5, 9, 1, 31}
	hold, err := pe.cli.CreateHold(ctx5(t), &messages.CreateHoldRequest{EngineId: pe.id, RegionId: pe.rid, BlockIds: src, NumTokens: 90})
	if err != nil {
		t.Fatal(err)
	}
	for i, dst := range [][]uint32{{0, 1, 2, 7, 8, 20}, {10, 11, 12, 13, 14, 15}} {
		id := fmt.Sprintf("pull%d", i)
		if _, err := de.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: hold.Params, EngineId: de.id, RegionId: de.rid, BlockIds: dst, PullId: id}); err != nil {
			t.Fatal(err)
		}
		d := done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == id })
		if !d.Ok {
			t.Fatalf("%s: %s (code %d)", id, d.Error, d.ErrorCode)
		}
		verifyBlocks(t, pe.region, de.region, src, dst, nil)
	}
	// What the engine writes through its mapping is what the next pull reads.
	for layer := uint32(0); layer < testLayout.Layers; layer++ {
		for p := uint32(0); p < testLayout.Planes; p++ {
			pe.region.Block(layer, p, 31)[7] ^= 0x5A
		}
	}
	if _, err := de.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: hold.Params, EngineId: de.id, RegionId: de.rid, BlockIds: []uint32{16}, PullId: "rewritten"}); err == nil {
		// A pull names as many destination blocks as the hold has: one
		// block is refused before anything is read.
		t.Fatal("a pull into fewer blocks than the hold was accepted")
	}
	dst := []uint32{16, 17, 18, 19, 21, 22}
	if _, err := de.cli.StartPull(ctx5(t), &messages.StartPullRequest{Params: hold.Params, EngineId: de.id, RegionId: de.rid, BlockIds: dst, PullId: "rewritten"}); err != nil {
		t.Fatal(err)
	}
	if d := done.wait(t, 10*time.Second, func(m *messages.PullDone) bool { return m.PullId == "rewritten" }); !d.Ok {
		t.Fatalf("pull after the engine wrote: %s", d.Error)
	}
	verifyBlocks(t, pe.region, de.region, src, dst, nil)

	// engine.gone ends the hold and frees the region; the engine's own
	// mapping stays valid.
	gone, err := pe.cli.EngineGone(ctx5(t), &messages.EngineGoneRequest{EngineId: pe.id})
	if err != nil || gone.HoldsDropped != 1 || gone.RegionsDropped != 1 {
		t.Fatalf("engine gone: %v %v", gone, err)
	}
	if _, err := pe.cli.InspectRegion(ctx5(t), &messages.RegionRef{EngineId: pe.id, RegionId: pe.rid}); !errors.As(err, &ae) || ae.Code != api.CodeUnknownRegion {
		t.Fatalf("inspect after engine gone: %v, want code %d", err, api.CodeUnknownRegion)
	}
	pe.region.Bytes()[0]++
}
