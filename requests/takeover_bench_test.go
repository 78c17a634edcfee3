package requests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

// BenchmarkTakeover is the store's part of a router's resume landing on a
// new engine (request.start with takeover): read the request's stored state
// from the stream leader, move it to the next epoch, write it back with
// compare-and-set; against an embedded NATS server with JetStream in this
// process. "split" is this store (Head, Takeover, Update of the record);
// "whole" is the path before the prompt split, kept here only to compare
// (the whole state read, rebuilt from the resent tokens and written back).
// Each reports the bytes written and read per takeover; the parent prints a
// TAKEOVER line per prompt length with the ratio of the two in this run, and
// the time of a creation (untimed set-up: the split one writes two entries).
func BenchmarkTakeover(b *testing.B) {
	generated := make([]uint32, 64)
	for i := range generated {
		generated[i] = uint32(200 + i)
	}
	type result struct{ ns, written, read, create float64 }
	for _, n := range []int{1024, 8192} {
		got := map[string]result{}
		for _, path := range []string{"whole", "split"} {
			b.Run(fmt.Sprintf("prompt=%d/%s", n, path), func(b *testing.B) {
				s, nc, ctx := openStore(b, 10*time.Minute)
				kv := &countingKV{KeyValue: s.KV}
				s.KV = kv
				// One request per takeover, each at its first move (epoch
				// 1 to 2), as a kill moves them.
				m := longStart("bench", n)
				resumes := make([]*messages.StartRequestMsg, b.N)
				t0 := time.Now()
				for i := range resumes {
					id := fmt.Sprintf("bench-%d", i)
					first := &messages.StartRequestMsg{RequestId: id, EngineId: m.EngineId, PromptTokenIds: m.PromptTokenIds,
						Params: m.Params, ResumeAuthority: m.ResumeAuthority}
					st, err := New(first, "d1", time.Now())
					if err != nil {
						b.Fatal(err)
					}
					if path == "whole" {
						oldRecord(b, ctx, s, st)
					} else if _, err := s.Create(ctx, st); err != nil {
						b.Fatal(err)
					}
					resumes[i] = resumeOf(first, generated)
				}
				created := float64(time.Since(t0).Nanoseconds()) / float64(b.N)
				takeover := splitTakeover
				if path == "whole" {
					takeover = wholeTakeover
				}
				kv.bytes = 0
				in0 := nc.Stats().InBytes
				b.ResetTimer()
				for i := range b.N {
					if err := takeover(ctx, s, resumes[i], "d2"); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				r := result{ns: float64(b.Elapsed().Nanoseconds()) / float64(b.N), written: float64(kv.bytes) / float64(b.N),
					read: float64(nc.Stats().InBytes-in0) / float64(b.N), create: created}
				b.ReportMetric(r.written, "B_written/op")
				b.ReportMetric(r.read, "B_read/op")
				got[path] = r
			})
		}
		if w, s := got["whole"], got["split"]; w.ns > 0 && s.ns > 0 {
			fmt.Printf("TAKEOVER prompt=%d whole_ns=%.0f split_ns=%.0f ratio_split_vs_whole=%.3f whole_B_written=%.0f split_B_written=%.0f whole_B_read=%.0f split_B_read=%.0f create_whole_ns=%.0f create_split_ns=%.0f\n",
				n, w.ns, s.ns, s.ns/w.ns, w.written, s.written, w.read, s.read, w.create, s.create)
		}
	}
}

// splitTakeover is a takeover as the request actor does it now: the record
// read, Takeover (the stored prompt kept), the record written.
func splitTakeover(ctx context.Context, s *KVStore, resume *messages.StartRequestMsg, owner string) error {
	head, rev, err := s.Head(ctx, resume.RequestId)
	if err != nil {
		return err
	}
	next, err := Takeover(head, resume, owner, time.Now())
	if err != nil {
		return err
	}
	_, err = s.Update(ctx, next, rev, PromptChanged(head, next))
	return err
}

// wholeTakeover is a takeover as it was before the prompt split: the whole
// state read, a new state built from the resent tokens (all of them the
// prompt), and all of it written back.
func wholeTakeover(ctx context.Context, s *KVStore, resume *messages.StartRequestMsg, owner string) error {
	st, rev, err := s.Head(ctx, resume.RequestId) // a record before the split holds the whole state
	if err != nil {
		return err
	}
	fresh, err := New(resume, owner, time.Now())
	if err != nil {
		return err
	}
	fresh.Epoch = st.Epoch + 1
	fresh.PreviousOwners = append(append([]string(nil), st.PreviousOwners...), st.Owner)
	fresh.PromptLen, fresh.PromptDigest, fresh.PromptKey = 0, nil, ""
	data, err := proto.Marshal(fresh)
	if err != nil {
		return err
	}
	_, err = s.KV.Update(ctx, Key(resume.RequestId), data, rev)
	return err
}
