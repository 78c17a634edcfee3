package clusterstatus

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/connex/connex/messages"
)

func TestResumedBy(t *testing.T) {
	for _, c := range []struct {
		name     string
		q        *messages.RequestState
		by, from string
	}{
		// The row issue 32 saw: a router-driven request never resumed
		// showed RESUMED_BY router.
		{"router-driven, never resumed", &messages.RequestState{Epoch: 1, ResumeAuthority: "router"}, "-", "-"},
		{"cluster-driven, never resumed", &messages.RequestState{Epoch: 1}, "-", "-"},
		{"resumed by the router", &messages.RequestState{Epoch: 2, ResumeAuthority: "router", PreviousOwners: []string{"decode-0"}}, "router", "decode-0"},
		{"adopted by the cluster, twice", &messages.RequestState{Epoch: 3, PreviousOwners: []string{"d1", "d2"}}, "cluster", "d1,d2"},
		{"moved, owners unknown", &messages.RequestState{Epoch: 2, ResumeAuthority: "router"}, "router", "-"},
	} {
		if by, from := resumedBy(c.q); by != c.by || from != c.from {
			t.Errorf("%s: RESUMED_BY %q FROM %q, want %q %q", c.name, by, from, c.by, c.from)
		}
	}
}

// TestRenderRequestRows: the request table's RESUMED_BY and FROM columns
// line up under their headers for a fresh and a resumed request.
func TestRenderRequestRows(t *testing.T) {
	at := time.UnixMilli(1_000_000)
	params := &messages.KVTransferParams{TransferId: "t1", RemoteCtrl: &messages.RemoteCtrl{Member: "prefill-0"}}
	r := &Report{At: at, Members: []*messages.MemberStatus{{
		MemberId: "decode-1", Role: "decode",
		Requests: []*messages.RequestState{
			{RequestId: "r-fresh", Owner: "decode-1", EngineId: "decode-1", Epoch: 1, ResumeAuthority: "router", Params: params, UpdatedUnixMs: at.UnixMilli() - 50},
			{RequestId: "r-moved", Owner: "decode-1", EngineId: "decode-1", Epoch: 2, ResumeAuthority: "router", PreviousOwners: []string{"decode-0"}, Params: params, UpdatedUnixMs: at.UnixMilli() - 50},
		},
	}}}
	var out bytes.Buffer
	if err := Render(&out, r); err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, l := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			rows[f[0]] = f
		}
	}
	head := rows["REQUEST"]
	col := func(name string) int {
		for i, h := range head {
			if h == name {
				return i
			}
		}
		t.Fatalf("no %s column in %v", name, head)
		return 0
	}
	by, from := col("RESUMED_BY"), col("FROM")
	for id, want := range map[string][2]string{"r-fresh": {"-", "-"}, "r-moved": {"router", "decode-0"}} {
		f := rows[id]
		if len(f) <= from || f[by] != want[0] || f[from] != want[1] {
			t.Errorf("%s row %v: RESUMED_BY, FROM want %v\n%s", id, f, want, out.String())
		}
	}
}
