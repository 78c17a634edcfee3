package e2e

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/connex/connex/harness/localcluster"
)

// loadPrompt follows a number that makes every prompt distinct: a short chat
// turn.
const loadPrompt = "Hi! Could you tell me, in a sentence or two, what the weather is usually like in Lisbon in May?"

// loadResult is one request of BenchmarkLoad as the client saw it.
type loadResult struct {
	n       int
	id      string // X-Connex-Request-Id
	prefill string // X-Connex-Prefill-Engine
	decode  string // X-Connex-Decode-Engine
	status  int
	ttft    time.Duration // to the first content chunk (0: none came)
	total   time.Duration // to the end of the stream
	tokens  int           // the usage chunk's completion_tokens
	err     string        // empty: the request succeeded
}

// BenchmarkLoad (make bench-load, issue 46 item 5): many requests through a
// real local cluster, and the slowest of them. The cluster is `make run`'s
// (localcluster.Defaults with connex-up's restart policy and metrics: the
// router, one prefill and two decode engines, each connex-sim with its
// connexd, separate processes) with connex-sim's decode at
// BENCH_LOAD_DECODE_MS ms a token (default 1, as in the measurement;
// connex-up's own default is Defaults' 20) and every process at log level
// info. BENCH_REQUESTS (default 100000) streamed completions, each a short
// distinct prompt with max_tokens BENCH_LOAD_MAX_TOKENS (default 16: a chat
// turn), go through the router from BENCH_CONCURRENCY (default 32)
// closed-loop clients. It prints
// `LOAD requests= concurrency= rps= p50_ms= p99_ms= p999_ms= slowest_ms=
// slowest_ttft_ms= failed=`, then the 5 slowest requests (id, engines, time
// to first token, total) with every cluster log line that names their
// request id or a transfer id those lines name. The whole cluster log goes to
// a file in os.TempDir(), whose path it prints. There is no timed assertion:
// the goal is a slowest request of at most 2 s.
func BenchmarkLoad(b *testing.B) {
	total := envInt("BENCH_REQUESTS", 100000)
	conc := envInt("BENCH_CONCURRENCY", 32)
	maxTokens := envInt("BENCH_LOAD_MAX_TOKENS", 16)
	decodeMS := envInt("BENCH_LOAD_DECODE_MS", 1)

	logFile, err := os.CreateTemp("", "connex-load-*.log")
	if err != nil {
		b.Fatal(err)
	}
	logPath := logFile.Name()
	sink := &loadLog{w: bufio.NewWriterSize(logFile, 1<<20)}
	defer func() {
		sink.flush()
		_ = logFile.Close()
	}()

	bins := productBinaries(b)
	o := localcluster.Defaults()
	o.Connexd, o.Sim = bins.Connexd, bins.Sim
	o.Restart, o.Metrics = localcluster.DefaultRestart, true // as connex-up sets them
	o.DecodePerToken = time.Duration(decodeMS) * time.Millisecond
	o.LogLevel = "info"
	o.Log = sink
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	c, err := localcluster.Start(ctx, o)
	cancel()
	if err != nil {
		b.Fatal(err)
	}
	closed := false
	closeCluster := func() {
		if !closed {
			closed = true
			if err := c.Close(); err != nil {
				b.Logf("close cluster: %v", err)
			}
		}
	}
	defer closeCluster()

	url := c.RouterURL() + "/v1/completions"
	client := &http.Client{Transport: &http.Transport{MaxIdleConns: 2 * conc, MaxIdleConnsPerHost: 2 * conc, DisableCompression: true}}
	results := make([]loadResult, total)
	var next, done atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				n := int(next.Add(1)) - 1
				if n >= total {
					return
				}
				results[n] = loadRequest(client, url, o.Model, n, maxTokens)
				if d := done.Add(1); d%10000 == 0 {
					el := time.Since(start)
					fmt.Fprintf(os.Stderr, "load: %d/%d requests in %s (%.0f rps)\n", d, total, el.Round(time.Second), float64(d)/el.Seconds())
				}
			}
		}()
	}
	wg.Wait()
	span := time.Since(start)
	b.StopTimer()
	closeCluster() // its processes' last lines reach the log
	sink.flush()

	failed := 0
	var lat []time.Duration
	var firstErr string
	for _, r := range results {
		if r.err != "" {
			failed++
			if firstErr == "" {
				firstErr = fmt.Sprintf("request %d (%s): %s", r.n, r.id, r.err)
			}
			continue
		}
		lat = append(lat, r.total)
	}
	slices.Sort(lat)
	q := func(p float64) float64 {
		if len(lat) == 0 {
			return 0
		}
		return ms(lat[min(len(lat)-1, int(p*float64(len(lat))))])
	}
	// The slowest, failed ones included: a request that failed late is as
	// slow as its time says.
	order := make([]int, total)
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(x, y int) int { return cmp.Compare(results[y].total, results[x].total) })
	slow := order[:min(5, len(order))]
	slowest := results[slow[0]]

	fmt.Printf("load bench: %d requests, concurrency %d, connex-sim decode %d ms/token, max_tokens %d, 1 prefill + 2 decode engines (make run's cluster)\n",
		total, conc, decodeMS, maxTokens)
	if firstErr != "" {
		fmt.Printf("first failure: %s\n", firstErr)
	}
	fmt.Printf("LOAD requests=%d concurrency=%d rps=%.0f p50_ms=%.1f p99_ms=%.1f p999_ms=%.1f slowest_ms=%.1f slowest_ttft_ms=%.1f failed=%d\n",
		total, conc, float64(total)/span.Seconds(), q(0.5), q(0.99), q(0.999), ms(slowest.total), ms(slowest.ttft), failed)

	lines := grepLoadLog(b, logPath, slow, results)
	for i, k := range slow {
		r := results[k]
		status := "ok"
		if r.err != "" {
			status = "FAILED: " + r.err
		}
		fmt.Printf("slowest #%d: request %d id=%s prefill=%s decode=%s status=%d ttft_ms=%.1f total_ms=%.1f tokens=%d %s\n",
			i+1, r.n, r.id, r.prefill, r.decode, r.status, ms(r.ttft), ms(r.total), r.tokens, status)
		for _, l := range lines[k] {
			fmt.Printf("    %s\n", l)
		}
	}
	fmt.Printf("cluster log (every process, level info): %s\n", logPath)
}

// loadRequest sends request n, a streamed completion, and reads it to the
// end.
func loadRequest(client *http.Client, url, model string, n, maxTokens int) (r loadResult) {
	r.n = n
	body := `{"model":` + strconv.Quote(model) + `,"prompt":` + strconv.Quote(strconv.Itoa(n)+" "+loadPrompt) +
		`,"max_tokens":` + strconv.Itoa(maxTokens) + `,"stream":true,"stream_options":{"include_usage":true}}`
	t0 := time.Now()
	defer func() { r.total = time.Since(t0) }()
	resp, err := client.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		r.err = err.Error()
		return r
	}
	defer resp.Body.Close()
	r.status = resp.StatusCode
	r.id = resp.Header.Get("X-Connex-Request-Id")
	r.prefill = resp.Header.Get("X-Connex-Prefill-Engine")
	r.decode = resp.Header.Get("X-Connex-Decode-Engine")
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		r.err = fmt.Sprintf("status %d: %s", resp.StatusCode, bytes.TrimSpace(data))
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	dones, finished := 0, false
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if bytes.Equal(data, []byte("[DONE]")) {
			dones++
			continue
		}
		var ch struct {
			ID      string `json:"id"`
			Choices []struct {
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
			Error *struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &ch); err != nil {
			r.err = fmt.Sprintf("chunk %q: %v", data, err)
			return r
		}
		if r.id == "" {
			r.id = ch.ID
		}
		if ch.Error != nil && r.err == "" {
			r.err = "error event " + ch.Error.Code + ": " + ch.Error.Message
		}
		if ch.Usage != nil {
			r.tokens = ch.Usage.CompletionTokens
		}
		for _, c := range ch.Choices {
			if c.Text != "" && r.ttft == 0 {
				r.ttft = time.Since(t0)
			}
			if c.FinishReason != nil {
				finished = true
			}
		}
	}
	switch {
	case r.err != "":
	case sc.Err() != nil:
		r.err = sc.Err().Error()
	case dones != 1 || !finished:
		r.err = fmt.Sprintf("stream ended with %d [DONE] lines, finish reason seen: %v", dones, finished)
	case r.tokens != maxTokens:
		r.err = fmt.Sprintf("%d completion tokens, want %d", r.tokens, maxTokens)
	}
	return r
}

// loadLog is BenchmarkLoad's cluster log sink: a buffered file.
type loadLog struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (l *loadLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

func (l *loadLog) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	_ = l.w.Flush()
}

var transferRE = regexp.MustCompile(`transfer(?:_id)?=([0-9A-Za-z_.:-]+)`)

// grepLoadLog returns, for each request index in slow, the log lines at
// path that name its request id or a transfer id that one of those lines
// names (two passes over the file).
func grepLoadLog(b *testing.B, path string, slow []int, results []loadResult) map[int][]string {
	keys := map[string]int{} // a request id or transfer id → request index
	for _, k := range slow {
		if id := results[k].id; id != "" {
			keys[id] = k
		}
	}
	out := map[int][]string{}
	scan := func(each func(line string)) {
		f, err := os.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 16<<20)
		for sc.Scan() {
			each(sc.Text())
		}
		if err := sc.Err(); err != nil {
			b.Fatalf("%s: %v", filepath.Base(path), err)
		}
	}
	ids := map[string]int{}
	for id, k := range keys {
		ids[id] = k
	}
	scan(func(line string) {
		for id, k := range ids {
			if strings.Contains(line, id) {
				for _, m := range transferRE.FindAllStringSubmatch(line, -1) {
					if m[1] != "" && m[1] != `""` {
						keys[m[1]] = k
					}
				}
			}
		}
	})
	scan(func(line string) {
		for key, k := range keys {
			if strings.Contains(line, key) {
				out[k] = append(out[k], line)
				return
			}
		}
	})
	return out
}
