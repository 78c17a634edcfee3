package ucx

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/connex/connex/transport"
)

// TestOnlyUCXUsesCgo fails if any package of the module other than
// transport/ucx has cgo files, with and without the ucx tag: everything else
// must build with CGO_ENABLED=0.
func TestOnlyUCXUsesCgo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list over the module")
	}
	gobin := filepath.Join(runtime.GOROOT(), "bin", "go")
	for _, tags := range []string{"", "ucx"} {
		cmd := exec.Command(gobin, "list", "-tags", tags, "-deps", "-f", "{{.ImportPath}} {{.CgoFiles}}", "./...")
		cmd.Dir = "../.."
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("go list -tags %q: %v\n%s", tags, err, out)
		}
		sawSelf := false
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			pkg, files, _ := strings.Cut(line, " ")
			if !strings.HasPrefix(pkg, "github.com/connex/connex") {
				continue
			}
			if pkg == "github.com/connex/connex/transport/ucx" {
				sawSelf = true
				continue
			}
			if files != "[]" {
				t.Errorf("tags %q: %s has cgo files %s; only transport/ucx may import \"C\"", tags, pkg, files)
			}
		}
		if !sawSelf {
			t.Errorf("tags %q: go list did not list transport/ucx; wrong module root?", tags)
		}
	}
}

func TestPeerErrMode(t *testing.T) {
	for tls, want := range map[string]bool{
		"": false, "tcp": true, "tcp,self": true, " tcp ": true, "self": false,
		"sm": false, "posix,sysv,tcp": false, "^sm": false, "all": false, "cma,tcp": true, "posix,tcp": false,
	} {
		if got := peerErrMode(tls); got != want {
			t.Errorf("peerErrMode(%q) = %v, want %v", tls, got, want)
		}
	}
}

// TestAllocates: Caps.Allocate follows whether the transport list has
// UCX's posix shared memory, which Allocate needs.
func TestAllocates(t *testing.T) {
	for tls, want := range map[string]bool{
		"": true, SafeDefaultTLS: true, OneSidedDefaultTLS: false, "tcp": false, "posix,sysv,self": true, " sm ": true,
		"shm,tcp": true, "all": true, "^sm": false, "^posix,tcp": false, "^cma": true, "sysv,self": false, "rc,mm": true,
	} {
		if got := allocates(tls); got != want {
			t.Errorf("allocates(%q) = %v, want %v", tls, got, want)
		}
	}
}

func TestKeyFormat(t *testing.T) {
	k := packCheckedKey(0x1000, 4096, 7<<32|3, 0xdeadbeef)
	rk, err := parseKey(k)
	if err != nil || rk.base != 0x1000 || rk.n != 4096 || rk.kind != keyChecked || rk.reg != 7<<32|3 || rk.token != 0xdeadbeef {
		t.Fatalf("checked key round trip: %+v %v", rk, err)
	}
	k = packRMAKey(0x2000, 10, []byte{1, 2, 3})
	rk, err = parseKey(k)
	if err != nil || rk.kind != keyRMA || string(rk.rkey) != "\x01\x02\x03" {
		t.Fatalf("rma key round trip: %+v %v", rk, err)
	}
	for _, bad := range [][]byte{nil, []byte("cxk1"), k[:keyHdr], packCheckedKey(0, 1, 0, 1), packCheckedKey(^uint64(0), 2, 1, 1),
		append(packCheckedKey(0, 1, 1, 1), 0)} {
		if _, err := parseKey(bad); err == nil {
			t.Errorf("parseKey(%x) accepted", bad)
		}
	}
	if _, err := parseAddr([]byte("127.0.0.1:80")); err == nil {
		t.Error("parseAddr accepted a TCP address")
	}
}

func TestSentinels(t *testing.T) {
	for code, want := range map[int]error{
		-80: transport.ErrPeerGone, -25: transport.ErrPeerGone, -6: transport.ErrPeerGone, -20: transport.ErrPeerGone,
		-16: transport.ErrCanceled, -12: transport.ErrNotRegistered, -4: nil, -101: transport.ErrFault,
	} {
		err := &StatusError{Op: "x", Code: code}
		if got := err.Unwrap(); got != want {
			t.Errorf("status %d unwraps to %v, want %v", code, got, want)
		}
	}
}
