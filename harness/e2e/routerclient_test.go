package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// streamed is one streamed answer as a client saw it.
type streamed struct {
	status  int
	header  http.Header
	texts   []string    // one entry per content chunk
	ids     []uint32    // token ids (return_token_ids)
	at      []time.Time // arrival of each content chunk
	dones   int         // "data: [DONE]" lines
	errors  []string    // error events' codes
	body    string      // the error body when status != 200
	finish  string
	usage   map[string]int
	connex  map[string]any // the router's record of the answer (the usage chunk's)
	started time.Time
}

func (s *streamed) text() string { return strings.Join(s.texts, "") }

// postStream posts a streamed completion and reads it to the end; onChunk
// runs after each content chunk (i counts from 1) on the reading goroutine.
func postStream(ctx context.Context, url string, body map[string]any, onChunk func(i int, s *streamed)) (*streamed, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	s := &streamed{started: time.Now()}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	s.status, s.header = resp.StatusCode, resp.Header
	if resp.StatusCode != http.StatusOK {
		data, _ := io.ReadAll(resp.Body)
		s.body = string(data)
		return s, nil
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			s.dones++
			continue
		}
		var ch struct {
			Choices []struct {
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				TokenIDs     []uint32 `json:"token_ids"`
				FinishReason *string  `json:"finish_reason"`
			} `json:"choices"`
			// The counts; nested details (completion_tokens_details, with
			// a reasoning parser) are left out.
			Usage  map[string]any `json:"usage"`
			Connex map[string]any `json:"connex"`
			Error  *struct {
				Code    string `json:"code"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if err := json.Unmarshal([]byte(line), &ch); err != nil {
			return s, fmt.Errorf("chunk %q: %w", line, err)
		}
		if ch.Connex != nil {
			s.connex = ch.Connex
		}
		if ch.Error != nil {
			s.errors = append(s.errors, ch.Error.Code+": "+ch.Error.Message)
		}
		if ch.Usage != nil {
			s.usage = map[string]int{}
			for k, v := range ch.Usage {
				if n, ok := v.(float64); ok {
					s.usage[k] = int(n)
				}
			}
		}
		for _, c := range ch.Choices {
			if c.FinishReason != nil {
				s.finish = *c.FinishReason
			}
			t := c.Text + c.Delta.Content
			if t == "" && len(c.TokenIDs) == 0 {
				continue
			}
			s.texts = append(s.texts, t)
			s.ids = append(s.ids, c.TokenIDs...)
			s.at = append(s.at, time.Now())
			if onChunk != nil {
				onChunk(len(s.texts), s)
			}
		}
	}
	return s, sc.Err()
}

// postJSON posts a non-streamed request and decodes the answer.
func postJSON(ctx context.Context, url string, body map[string]any) (int, map[string]any, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return resp.StatusCode, nil, err
	}
	return resp.StatusCode, out, nil
}

// scrape reads a Prometheus text endpoint into series → value; labels are
// kept as written ("name{a=\"b\"}").
func scrape(url string) (map[string]float64, error) { return scrapeAs(url, "") }

// scrapeClient bounds a scrape: a frozen (SIGSTOPped) process answers an
// error, not a hung test.
var scrapeClient = &http.Client{Timeout: 10 * time.Second}

// scrapeAs is scrape with "Authorization: Bearer <key>" (the router's
// /metrics wants its admin key: localcluster.Cluster.AdminKey).
func scrapeAs(url, key string) (map[string]float64, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := scrapeClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}

// sum adds every series of metric name (all label sets).
func sum(m map[string]float64, name string) float64 {
	var s float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			s += v
		}
	}
	return s
}

// awaitStatus polls GET url until it answers status, failing the test after
// total.
func awaitStatus(t testing.TB, total time.Duration, url string, status int) {
	t.Helper()
	checkFor(t, total, 20*time.Millisecond, func() error {
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != status {
			return fmt.Errorf("GET %s: %d, want %d", url, resp.StatusCode, status)
		}
		return nil
	})
}
