package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/connex/connex/api"
	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

// TestRegisterOnlyFilesInRegionDir: a hostile client asks a root connexd
// to register a 0600 file outside region_dir, directly or through a link
// inside it: refused with 406 forbidden, the file never opened (its bytes
// unchanged), and the error tells nothing about it.
func TestRegisterOnlyFilesInRegionDir(t *testing.T) {
	shm := shmDir(t)
	pn := startConnexd(t, "solo", "--backend", "tcp") // region_dir: /dev/shm, the default
	nc := connect(t, pn.natsURL)
	cli := &api.Client{NC: nc, Member: "solo"}
	l := testLayout
	victim := filepath.Join(t.TempDir(), "victim")
	secret := bytes.Repeat([]byte("secret!!"), int(l.Size()/8))
	if err := os.WriteFile(victim, secret, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(shm, "innocent.kv")); err != nil {
		t.Fatal(err)
	}
	pl := &messages.Layout{NumLayers: l.Layers, KvPlanes: l.Planes, NumBlocks: l.Blocks, BlockBytes: l.BlockBytes, BlockSize: l.BlockSize, TpSize: l.TPSize}
	for _, path := range []string{victim, filepath.Join(shm, "innocent.kv"), filepath.Join(shm, "..", "..", victim)} {
		_, err := cli.RegisterRegion(ctx5(t), &messages.RegisterRegionRequest{EngineId: "evil", RegionId: "r0", Path: path, Layout: pl})
		if api.CodeOf(err) != api.CodeForbidden {
			t.Fatalf("register %s: %v, want 406 forbidden", path, err)
		}
	}
	// A wrong layout on the victim must not be a size oracle either.
	small := proto.CloneOf(pl)
	small.NumBlocks = 1
	if _, err := cli.RegisterRegion(ctx5(t), &messages.RegisterRegionRequest{EngineId: "evil", RegionId: "r0", Path: victim, Layout: small}); api.CodeOf(err) != api.CodeForbidden {
		t.Fatalf("register the victim with another layout: %v, want 406 forbidden", err)
	}
	if got, err := os.ReadFile(victim); err != nil || !bytes.Equal(got, secret) {
		t.Fatalf("the victim file changed (%v)", err)
	}
	// The engine's own file beneath region_dir still registers.
	e := newEngine(t, nc, "solo", "good", l, false)
	if _, err := e.cli.InspectRegion(ctx5(t), &messages.RegionRef{EngineId: "good", RegionId: "r0"}); err != nil {
		t.Fatal(err)
	}
}
