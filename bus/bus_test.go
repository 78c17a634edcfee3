package bus

import (
	"errors"
	"net"
	"strings"
	"testing"
)

func TestDataDirIsLocked(t *testing.T) {
	dir := t.TempDir()
	first, err := Open(Options{Listen: "127.0.0.1:0", DataDir: dir, Name: "first"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(Options{Listen: "127.0.0.1:0", DataDir: dir, Name: "second"}); !errors.Is(err, ErrDataDirLocked) {
		t.Fatalf("a second embedded server on the same data_dir: %v, want ErrDataDirLocked", err)
	}
	first.Close()
	again, err := Open(Options{Listen: "127.0.0.1:0", DataDir: dir, Name: "again"})
	if err != nil {
		t.Fatalf("the lock must be released by Close: %v", err)
	}
	again.Close()
}

func TestTakenPortIsAnError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, err = Open(Options{Listen: ln.Addr().String(), DataDir: t.TempDir(), Name: "x"})
	if err == nil || !strings.Contains(err.Error(), "nats_listen="+ln.Addr().String()) || !strings.Contains(err.Error(), "nats_url") {
		t.Fatalf("a taken nats_listen: %v", err)
	}
}
