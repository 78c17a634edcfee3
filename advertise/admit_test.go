package advertise

import (
	"errors"
	"testing"
	"time"

	"github.com/connex/connex/messages"
)

func TestCheckRole(t *testing.T) {
	for _, c := range []struct {
		role, member string
		ok           bool
	}{
		{RolePrefill, "prefill", true}, {RoleDecode, "decode", true},
		{RolePrefill, "decode", false}, {RoleDecode, "prefill", false},
		{RolePrefill, "all", true}, {RoleDecode, "all", true}, {RoleDecode, "router", true},
	} {
		err := CheckRole(c.role, c.member)
		if (err == nil) != c.ok || (err != nil && !errors.Is(err, ErrWrongMember)) {
			t.Errorf("CheckRole(%s, member %s) = %v, want ok=%v", c.role, c.member, err, c.ok)
		}
	}
}

func TestClampBlocks(t *testing.T) {
	for _, c := range []struct {
		free, total, region, wantFree, wantTotal uint32
		changed                                  bool
	}{
		{free: 1 << 31, total: 1 << 31, region: 64, wantFree: 64, wantTotal: 64, changed: true},
		{free: 10, total: 64, region: 64, wantFree: 10, wantTotal: 64},
		{free: 10, total: 64, region: 0, wantFree: 0, wantTotal: 0, changed: true},
		{free: 100, total: 100, region: 128, wantFree: 100, wantTotal: 100},
	} {
		e := &messages.EngineInfo{BlocksFree: c.free, BlocksTotal: c.total}
		if changed := ClampBlocks(e, c.region); changed != c.changed || e.BlocksFree != c.wantFree || e.BlocksTotal != c.wantTotal {
			t.Errorf("ClampBlocks(free %d, total %d, region %d) = %d/%d changed=%v, want %d/%d changed=%v",
				c.free, c.total, c.region, e.BlocksFree, e.BlocksTotal, changed, c.wantFree, c.wantTotal, c.changed)
		}
	}
}

func TestCredCheckFresh(t *testing.T) {
	at := time.Unix(1000, 0)
	c := CredCheck{Role: RolePrefill, Model: "m", At: at}
	switch {
	case !c.Fresh(RolePrefill, "m", at.Add(CredCheckTTL-time.Millisecond)):
		t.Error("a check within its TTL is not fresh")
	case c.Fresh(RolePrefill, "m", at.Add(CredCheckTTL)):
		t.Error("a check past its TTL is fresh")
	case c.Fresh(RoleDecode, "m", at), c.Fresh(RolePrefill, "other", at):
		t.Error("a check vouches for another role or model")
	case (CredCheck{}).Fresh("", "", at):
		t.Error("no check is fresh")
	}
}
