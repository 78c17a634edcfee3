package cluster

import (
	"testing"
	"time"

	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"

	"github.com/connex/connex/natssubject"
)

// FuzzMemberOf: membership announcements arrive from anyone who may publish
// on the cluster subjects; whatever their bytes, memberOf answers without
// panicking, and a member it accepts has a valid id, a usable address and a
// bounded engine list.
func FuzzMemberOf(f *testing.F) {
	good := announceOf(Member{ID: "m1", Host: "10.0.0.1", Port: 7000, Role: RoleDecode, Kinds: []string{"b", "a"}, Name: "d1",
		Engines: []*messages.EngineInfo{{EngineId: "e1"}}}, 3, time.Unix(1, 0))
	seed, err := proto.Marshal(good)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var a messages.MemberAnnounce
		if proto.Unmarshal(data, &a) != nil {
			return
		}
		m, err := memberOf(&a)
		if err != nil {
			return
		}
		if !natssubject.ValidToken(m.ID) || m.Host == "" || m.Port <= 0 || m.Port > 65535 || len(m.Engines) > maxEngines {
			t.Fatalf("accepted %+v", m)
		}
		for i := 1; i < len(m.Kinds); i++ {
			if m.Kinds[i-1] > m.Kinds[i] {
				t.Fatalf("kinds not sorted: %v", m.Kinds)
			}
		}
	})
}
