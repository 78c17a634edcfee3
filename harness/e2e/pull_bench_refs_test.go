package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connex/connex/harness/poll"
	"github.com/connex/connex/transport/memcopy"
)

// benchPullMemcpy copies each layout's pieces with Go's copy (memmove), or
// with memcopy.Stream (non-temporal stores, what mapped UCX reads copy
// with) when stream is set, on
// threads goroutines (each a contiguous share of the pieces), alternating
// between two pre-faulted source buffers so the source is cold (each is
// 256 MiB, far beyond the caches); the destination is pre-faulted too, as an
// engine's KV region is. threads=1 is the RATIO line's reference; the
// mapped UCX reads copy on every core, so threads=GOMAXPROCS is shown too.
func benchPullMemcpy(b *testing.B, layouts []benchPullLayout, res *pullResults, name string, threads int, stream bool) {
	// stream copies as mapped UCX reads do: StreamUnfenced per piece, one
	// Fence per 1 MiB grain.
	cp, fence, how := func(d, s []byte) { copy(d, s) }, func() {}, "Go copy"
	if stream {
		cp, fence, how = func(d, s []byte) { memcopy.StreamUnfenced(d, s) }, memcopy.Fence, "memcopy.StreamUnfenced (KV blocks: StreamPairUnfenced, in pairs), Fence per MiB"
	}
	b.StopTimer()
	const reps = 9
	var total int64
	for _, l := range layouts {
		if l.pullOnly {
			continue
		}
		size := int(l.l.Size())
		srcs := [2][]byte{make([]byte, size), make([]byte, size)}
		fillPattern(srcs[0], 1)
		fillPattern(srcs[1], 2)
		dst := make([]byte, size)
		fillByte(dst, 0xEE)
		pieces := l.pieces()
		bb := l.l.BlockBytes
		switch {
		case len(l.src) == 1 && threads == 1: // contig: the two extents are adjacent, one copy
			bb = uint64(size)
			pieces = pieces[:1]
		case len(l.src) == 1: // contig on several threads: 1 MiB pieces
			bb = 1 << 20
			pieces = pieces[:0]
			for off := uint64(0); off < uint64(size); off += bb {
				pieces = append(pieces, [2]uint64{off, off})
			}
		}
		var ds []time.Duration
		for i := 0; i < max(reps, b.N); i++ {
			src := srcs[i%2]
			scrubCaches()
			b.StartTimer()
			t0 := time.Now()
			var wg sync.WaitGroup
			for t := range threads {
				wg.Add(1)
				go func(share [][2]uint64) {
					defer wg.Done()
					acc := uint64(0)
					for k := 0; k < len(share); k++ {
						p := share[k]
						if stream && bb < 1<<20 && k+1 < len(share) {
							// In pairs, as mapped UCX reads copy KV blocks.
							q := share[k+1]
							memcopy.StreamPairUnfenced(dst[p[1]:p[1]+bb], src[p[0]:p[0]+bb], dst[q[1]:q[1]+bb], src[q[0]:q[0]+bb])
							k++
							acc += bb
						} else {
							cp(dst[p[1]:p[1]+bb], src[p[0]:p[0]+bb])
						}
						if acc += bb; acc >= 1<<20 {
							fence()
							acc = 0
						}
					}
					fence()
				}(pieces[len(pieces)*t/threads : len(pieces)*(t+1)/threads])
			}
			wg.Wait()
			ds = append(ds, time.Since(t0))
			b.StopTimer()
			total += l.bytes()
		}
		s := statOf(l.bytes(), ds)
		s.note = fmt.Sprintf("%s, %d thread(s), cold source (2 alternating 256 MiB buffers), %d runs", how, threads, len(ds))
		if len(l.src) > 1 {
			s.note = fmt.Sprintf("%d copies of %d KiB, same geometry as the pull; ", len(l.pieces()), l.l.BlockBytes>>10) + s.note
		}
		res.put(name, l.name, s)
	}
	b.SetBytes(total / int64(b.N))
}

// benchPullPerftest runs ucx_perftest -t ucp_get, server and client on
// 127.0.0.1, for each layout at the layout's piece size.
func benchPullPerftest(b *testing.B, layouts []benchPullLayout, res *pullResults, name, tls string) {
	for _, l := range layouts {
		if l.context {
			continue
		}
		// contig: the whole 256 MiB as one GET; kv: 4096 GETs of 32 KiB with
		// up to 16 outstanding (the default, one at a time, is latency-bound
		// over tcp: ~0.03 GB/s).
		size, iters, extra := int(l.bytes()), 8, []string(nil)
		if len(l.src) > 1 {
			size, iters, extra = int(l.l.BlockBytes), len(l.pieces()), []string{"-O", "16"}
		}
		if tls == "tcp" && len(l.src) == 1 {
			iters = 4
		}
		bw, err := runPerftest(tls, size, iters, extra...)
		if err != nil {
			b.Fatalf("ucx_perftest %s %s: %v", tls, l.name, err)
		}
		res.put(name, l.name, pullStat{median: bw, best: bw,
			note: strings.Join(append(append([]string{"ucx_perftest -t ucp_get -s", strconv.Itoa(size), "-n", strconv.Itoa(iters)}, extra...),
				"UCX_TLS="+tls+", overall bw; re-reads one buffer (cache-hot when small)"), " ")})
	}
}

func runPerftest(tls string, size, iters int, extra ...string) (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	env := append(os.Environ(), "UCX_TLS="+tls)
	var srvOut bytes.Buffer
	srv := exec.Command("ucx_perftest", "-p", strconv.Itoa(port))
	srv.Env, srv.Stdout, srv.Stderr = env, &srvOut, &srvOut
	if err := srv.Start(); err != nil {
		return 0, err
	}
	srvDone := make(chan struct{})
	go func() { _ = srv.Wait(); close(srvDone) }()
	defer func() {
		select {
		case <-srvDone:
		case <-time.After(10 * time.Second):
			_ = srv.Process.Kill()
			<-srvDone
		}
	}()
	// Wait until the server listens; probing it with a connection would be
	// taken for the client, so read the kernel's socket table instead.
	exited := func() bool {
		select {
		case <-srvDone:
			return true
		default:
			return false
		}
	}
	listening := poll.Wait(10*time.Second, 5*time.Millisecond, func() bool { return exited() || tcpListening(port) })
	if exited() {
		return 0, fmt.Errorf("server exited: %s", srvOut.String())
	}
	if !listening {
		_ = srv.Process.Kill()
		return 0, fmt.Errorf("server not listening on %d within 10s", port)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	args := append([]string{"127.0.0.1", "-p", strconv.Itoa(port), "-t", "ucp_get",
		"-s", strconv.Itoa(size), "-n", strconv.Itoa(iters)}, extra...)
	cli := exec.CommandContext(ctx, "ucx_perftest", args...)
	cli.Env = env
	out, err := cli.CombinedOutput()
	if err != nil {
		_ = srv.Process.Kill()
		return 0, fmt.Errorf("client: %v\n%s\nserver:\n%s", err, out, srvOut.String())
	}
	// "Final:  iters  lat50 lat-avg lat-overall  bw-avg bw-overall  rate-avg rate-overall",
	// bandwidth in MB/s with UCX's MB = 2^20 bytes.
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 7 && f[0] == "Final:" {
			v, err := strconv.ParseFloat(f[6], 64)
			if err != nil {
				return 0, fmt.Errorf("bad Final line %q", sc.Text())
			}
			return v * (1 << 20), nil
		}
	}
	return 0, fmt.Errorf("no Final line in:\n%s", out)
}

// tcpListening reports whether something listens on TCP port (IPv4 or v6).
func tcpListening(port int) bool {
	want := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(data), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) > 3 && fs[3] == "0A" && strings.HasSuffix(fs[1], want) {
				return true
			}
		}
	}
	return false
}

// procCPU is the CPU time all threads of pid have used so far.
func procCPU(pid int) time.Duration {
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var ns int64
	for _, t := range tasks {
		data, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		if f := strings.Fields(string(data)); len(f) > 0 {
			v, _ := strconv.ParseInt(f[0], 10, 64)
			ns += v
		}
	}
	return time.Duration(ns)
}
