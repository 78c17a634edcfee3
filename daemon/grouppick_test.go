package daemon

import (
	"fmt"
	"strings"
	"testing"

	"github.com/connex/connex/kvmem"
	"github.com/connex/connex/messages"
)

func TestGroupPick(t *testing.T) {
	hold := &messages.KVTransferParams{RemoteBlockIds: []uint32{9, 1, 7, 2, 8}, GroupBlocks: []uint32{2, 3}, BlockSize: 16}
	dst := kvmem.Layout{BlockSize: 16}
	for _, tc := range []struct {
		skips []uint32
		skip  uint32
		p     *messages.KVTransferParams
		want  string // the pick, or the error's text
	}{
		{nil, 0, hold, "[]"},
		{[]uint32{0, 0}, 0, hold, "[0 1 2 3 4]"},
		{[]uint32{1, 2}, 0, hold, "[1 4]"},
		{[]uint32{2, 0}, 0, hold, "[2 3 4]"},
		{[]uint32{2, 3}, 0, hold, "skip every block"},
		{[]uint32{3, 0}, 0, hold, "group_skip_blocks[0]=3: the group has 2"},
		{[]uint32{1}, 0, hold, "names 1 groups, params.group_blocks 2"},
		{[]uint32{1, 0}, 1, hold, "one or the other"},
		{[]uint32{0, 1}, 0, &messages.KVTransferParams{RemoteBlockIds: []uint32{1, 2}, GroupBlocks: []uint32{1, 2}}, "add up to 3 blocks, the hold has 2"},
		{[]uint32{0, 1}, 0, &messages.KVTransferParams{RemoteBlockIds: []uint32{1, 2}, GroupBlocks: []uint32{1, 1}, BlockSize: 32}, "blocks move whole"},
	} {
		pick, err := groupPick(tc.p, &messages.StartPullRequest{GroupSkipBlocks: tc.skips, SkipBlocks: tc.skip}, dst)
		got := fmt.Sprint(pick)
		if pick == nil {
			got = "[]"
		}
		if err != nil {
			got = err.Error()
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("skips %v (skip_blocks %d): %s, want %q", tc.skips, tc.skip, got, tc.want)
		}
	}
}
