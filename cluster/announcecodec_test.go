package cluster

import (
	"testing"
	"time"

	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/proto"
)

func codecSelf() *Member {
	return &Member{ID: "m1", Host: "10.0.0.1", Port: 7000, Role: RoleDecode, Kinds: []string{"a", "b"}, Name: "d1"}
}

func codecEngines(ids ...string) *[]*messages.EngineInfo {
	es := make([]*messages.EngineInfo, len(ids))
	for i, id := range ids {
		es[i] = &messages.EngineInfo{EngineId: id, BaseUrl: "http://127.0.0.1:9000", Model: "m", BlockSize: 16}
	}
	return &es
}

// TestAnnounceEncoderIsTheAnnounce: a heartbeat built from the cached
// record decodes to exactly what announceOf says, beat after beat, and the
// record is marshalled again only when the member or its engines change.
func TestAnnounceEncoderIsTheAnnounce(t *testing.T) {
	marshals := 0
	enc := announceEncoder{marshal: func(m proto.Message) ([]byte, error) {
		marshals++
		return proto.MarshalOptions{Deterministic: true}.Marshal(m)
	}}
	self, engines := codecSelf(), codecEngines("e1", "e2")
	check := func(engines *[]*messages.EngineInfo, load int64, iv time.Duration, seq uint64, now time.Time) {
		t.Helper()
		b, err := enc.encode(self, engines, load, iv, seq, now)
		if err != nil {
			t.Fatal(err)
		}
		var got messages.MemberAnnounce
		if err := proto.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		m := *self
		m.Load, m.HeartbeatInterval = load, iv
		if engines != nil {
			m.Engines = *engines
		}
		if want := announceOf(m, seq, now); !proto.Equal(&got, want) {
			t.Fatalf("heartbeat decodes to\n%v\nwant\n%v", &got, want)
		}
	}
	t0 := time.UnixMilli(1_700_000_000_000)
	check(engines, 0, 50*time.Millisecond, 0, t0)
	check(engines, 5, 50*time.Millisecond, 1, t0.Add(50*time.Millisecond))
	check(engines, -3, 400*time.Millisecond, 2, t0.Add(100*time.Millisecond))
	check(engines, -3, 0, 3, t0.Add(100*time.Millisecond))
	if marshals != 1 {
		t.Fatalf("%d marshals for four beats of one record, want 1", marshals)
	}
	other := codecEngines("e1")
	check(other, 1, 50*time.Millisecond, 3, t0.Add(150*time.Millisecond))
	check(nil, 1, 50*time.Millisecond, 4, t0.Add(200*time.Millisecond))
	if marshals != 3 {
		t.Fatalf("%d marshals after two engine changes, want 3", marshals)
	}
}

// TestAnnounceDecoderReusesAnUnchangedRecord: a member's record is decoded
// once while its bytes stay the same (load, seq and time change every
// beat), and decoded again as soon as they differ.
func TestAnnounceDecoderReusesAnUnchangedRecord(t *testing.T) {
	var enc announceEncoder
	var dec announceDecoder
	self := codecSelf()
	engines := codecEngines("e1", "e2")
	t0 := time.UnixMilli(1_700_000_000_000)
	var beatEvery func(engines *[]*messages.EngineInfo, load int64, iv time.Duration, seq uint64) Member
	beat := func(engines *[]*messages.EngineInfo, load int64, seq uint64) Member {
		t.Helper()
		return beatEvery(engines, load, 50*time.Millisecond, seq)
	}
	beatEvery = func(engines *[]*messages.EngineInfo, load int64, iv time.Duration, seq uint64) Member {
		t.Helper()
		b, err := enc.encode(self, engines, load, iv, seq, t0.Add(time.Duration(seq)*50*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		m, err := dec.decode(self.ID, b)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m1 := beat(engines, 0, 0)
	m2 := beat(engines, 7, 1)
	if m2.Load != 7 || m1.Load != 0 {
		t.Fatalf("loads %d and %d, want 0 and 7", m1.Load, m2.Load)
	}
	if len(m2.Engines) != 2 || m1.Engines[0] != m2.Engines[0] {
		t.Fatal("an unchanged record was decoded again")
	}
	// The heartbeat interval travels beside the record: a member turning
	// idle is neither a new record nor a change for subscribers.
	idle := beatEvery(engines, 7, 400*time.Millisecond, 2)
	if idle.HeartbeatInterval != 400*time.Millisecond || m2.HeartbeatInterval != 50*time.Millisecond {
		t.Fatalf("intervals %v and %v, want 50ms and 400ms", m2.HeartbeatInterval, idle.HeartbeatInterval)
	}
	if idle.Engines[0] != m2.Engines[0] || !sameMember(m2, idle) {
		t.Fatal("a member that only changed its heartbeat interval was decoded again or compares different")
	}
	if sameMember(m1, m2) {
		t.Fatal("members with different loads compare the same")
	}
	m3 := beat(engines, 0, 2)
	if !sameMember(m1, m3) {
		t.Fatal("the same record and load compare different")
	}
	m4 := beat(codecEngines("e1", "e3"), 0, 3)
	if m4.Engines[1].GetEngineId() != "e3" {
		t.Fatalf("a changed record was not decoded again: engines %v", m4.Engines)
	}
	if sameMember(m3, m4) {
		t.Fatal("members with different engines compare the same")
	}
	// The record path and the field-by-field path agree.
	plain3, plain4 := m3, m4
	plain3.record, plain4.record = "", ""
	if !sameMember(plain3, m3) || sameMember(plain3, plain4) {
		t.Fatal("the record comparison disagrees with the field comparison")
	}
}

// TestAnnounceDecoderRefuses: bytes that are not an announce, an announce
// memberOf refuses, and one naming another member than its subject are
// errors, and a refused heartbeat leaves no record behind.
func TestAnnounceDecoderRefuses(t *testing.T) {
	var dec announceDecoder
	good, err := proto.Marshal(announceOf(*codecSelf(), 1, time.UnixMilli(1)))
	if err != nil {
		t.Fatal(err)
	}
	bad := announceOf(*codecSelf(), 1, time.UnixMilli(1))
	bad.Port = 0
	noPort, err := proto.Marshal(bad)
	if err != nil {
		t.Fatal(err)
	}
	wrongLoad := append([]byte{0x38 | 2, 1, 0}, good...) // field 7 as length-delimited
	for name, c := range map[string]struct {
		id string
		b  []byte
	}{
		"truncated":    {"m1", good[:len(good)-1]},
		"garbage":      {"m1", []byte{0xff, 0xff, 0xff}},
		"no port":      {"m1", noPort},
		"other member": {"m2", good},
		"load type":    {"m1", wrongLoad},
	} {
		if m, err := dec.decode(c.id, c.b); err == nil {
			t.Errorf("%s: decoded %+v", name, m)
		}
	}
	if len(dec.last) != 0 {
		t.Fatalf("refused heartbeats left records: %v", dec.last)
	}
	if _, err := dec.decode("m1", good); err != nil {
		t.Fatal(err)
	}
}

// FuzzAnnounceDecoder: whatever the bytes, the caching decoder answers as
// the plain one does, on the first heartbeat and on a repeat.
func FuzzAnnounceDecoder(f *testing.F) {
	seed, err := proto.Marshal(announceOf(Member{ID: "m1", Host: "h", Port: 1, Kinds: []string{"k"},
		Engines: []*messages.EngineInfo{{EngineId: "e1"}}}, 3, time.UnixMilli(9)))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(seed)
	f.Add([]byte{})
	idle := announceOf(Member{ID: "m1", Host: "h", Port: 1, HeartbeatInterval: 400 * time.Millisecond}, 4, time.UnixMilli(9))
	if b, err := proto.Marshal(idle); err == nil {
		f.Add(b)
		f.Add(append(b, 0x60, 0xff, 0xff, 0xff, 0xff, 0x1f)) // heartbeat_interval_ms past 32 bits, again
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var dec announceDecoder
		want, wantErr := decodeAnnounce(b)
		for range 2 {
			got, err := dec.decode("m1", b)
			if (err == nil) != (wantErr == nil && want.ID == "m1") {
				t.Fatalf("decoder error %v, plain error %v (id %q)", err, wantErr, want.ID)
			}
			g, w := got, want
			g.record, w.record = "", "" // compare field by field
			if err == nil && (!sameMember(g, w) || g.HeartbeatInterval != w.HeartbeatInterval) {
				t.Fatalf("decoder %+v, plain %+v", got, want)
			}
		}
	})
}
