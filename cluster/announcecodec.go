package cluster

import (
	"fmt"
	"math"
	"time"

	"github.com/connex/connex/messages"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// A heartbeat is a MemberAnnounce: a record that rarely changes (address,
// role, kinds, name and the registered engines with their layouts) and
// fields that change with the beat (load, seq, sent_unix_ms, and the
// heartbeat interval when the member turns idle or busy). At the
// local preset every member sends 20 a second and reads 20 from every
// other member; marshalling, unmarshalling and deep-comparing the record
// each time was about a fifth of an idle connexd's CPU. The codec below
// keeps the wire unchanged (protobuf allows a message's fields in any
// order, so the record's bytes are cached and the volatile fields
// appended) and lets a receiver recognise an unchanged record by its
// bytes.

// Field numbers of MemberAnnounce's volatile fields (messages/membership.proto).
const (
	fieldLoad   protowire.Number = 7
	fieldSeq    protowire.Number = 8
	fieldSentMs protowire.Number = 9
	// fieldInterval is heartbeat_interval_ms.
	fieldInterval protowire.Number = 12
)

// announceEncoder builds this member's heartbeats. The record's bytes are
// marshalled again only when the record changes; it is used by one
// goroutine (the provider's loop).
type announceEncoder struct {
	self    *Member                 // the record the cache was built from
	engines *[]*messages.EngineInfo // the engine list it was built from
	rec     []byte                  // the marshalled record, volatile fields zero
	buf     []byte                  // the last heartbeat, reused
	marshal func(proto.Message) ([]byte, error)
}

// encode returns the heartbeat of self with engines, load, the heartbeat
// interval it keeps, seq and now. The returned bytes are valid until the
// next call. self and engines are compared by identity: the provider
// replaces, never mutates, them.
func (e *announceEncoder) encode(self *Member, engines *[]*messages.EngineInfo, load int64, interval time.Duration, seq uint64, now time.Time) ([]byte, error) {
	if e.rec == nil || e.self != self || e.engines != engines {
		m := *self
		m.Load = 0
		m.HeartbeatInterval = 0
		m.Engines = nil
		if engines != nil {
			m.Engines = *engines
		}
		marshal := e.marshal
		if marshal == nil {
			marshal = proto.MarshalOptions{Deterministic: true}.Marshal
		}
		rec, err := marshal(announceOf(m, 0, time.Time{}))
		if err != nil {
			return nil, fmt.Errorf("heartbeat of %s: %w", self.ID, err)
		}
		// announceOf sets sent_unix_ms from the zero time: drop it, so that
		// the record holds no volatile field at all.
		rec = withoutVolatile(rec)
		e.self, e.engines, e.rec = self, engines, rec
	}
	b := append(e.buf[:0], e.rec...)
	if load != 0 {
		b = protowire.AppendTag(b, fieldLoad, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(load))
	}
	if ms := interval.Milliseconds(); ms > 0 {
		b = protowire.AppendTag(b, fieldInterval, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(min(ms, math.MaxUint32)))
	}
	if seq != 0 {
		b = protowire.AppendTag(b, fieldSeq, protowire.VarintType)
		b = protowire.AppendVarint(b, seq)
	}
	if ms := now.UnixMilli(); ms != 0 {
		b = protowire.AppendTag(b, fieldSentMs, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(ms))
	}
	e.buf = b
	return b, nil
}

// withoutVolatile returns b's top-level fields other than load, seq,
// sent_unix_ms and heartbeat_interval_ms, in their order; b must be a
// valid message.
func withoutVolatile(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for len(b) > 0 {
		num, _, n := protowire.ConsumeField(b)
		if n < 0 {
			return append(out, b...) // not reached for our own marshalling
		}
		if !volatileField(num) {
			out = append(out, b[:n]...)
		}
		b = b[n:]
	}
	return out
}

// volatileField reports whether num is one of MemberAnnounce's fields
// that change with the beat rather than with the record.
func volatileField(num protowire.Number) bool {
	return num == fieldLoad || num == fieldSeq || num == fieldSentMs || num == fieldInterval
}

// announceBeat is what an announce says besides its record: the fields
// that change with the beat and that a receiver keeps.
type announceBeat struct {
	load     int64
	interval time.Duration
}

// splitAnnounce separates an announce's record bytes (every top-level field
// but the volatile ones, in their order) from its load and heartbeat
// interval. It fails on bytes that are not a well-formed message at the
// top level.
func splitAnnounce(b []byte, rec []byte) (record []byte, beat announceBeat, err error) {
	rec = rec[:0]
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeField(b)
		if n < 0 {
			return nil, announceBeat{}, fmt.Errorf("announce: %w", protowire.ParseError(n))
		}
		switch num {
		case fieldLoad, fieldInterval:
			if typ != protowire.VarintType {
				return nil, announceBeat{}, fmt.Errorf("announce: field %d has wire type %d", num, typ)
			}
			_, _, tn := protowire.ConsumeTag(b)
			v, vn := protowire.ConsumeVarint(b[tn:])
			if vn < 0 {
				return nil, announceBeat{}, fmt.Errorf("announce: field %d: %w", num, protowire.ParseError(vn))
			}
			// The last occurrence wins, as in proto.Unmarshal.
			if num == fieldLoad {
				beat.load = int64(v)
			} else {
				beat.interval = intervalOfMs(uint32(v))
			}
		case fieldSeq, fieldSentMs:
		default:
			rec = append(rec, b[:n]...)
		}
		b = b[n:]
	}
	return rec, beat, nil
}

// intervalOfMs is an announced heartbeat_interval_ms as a duration (a
// uint32 field: proto.Unmarshal keeps the low 32 bits of a longer varint,
// and so does this).
func intervalOfMs(ms uint32) time.Duration { return time.Duration(ms) * time.Millisecond }

// maxDecodeCache bounds the members whose last record a decoder remembers;
// past it the cache starts again (members come and go with new ids).
const maxDecodeCache = 1024

// announceDecoder turns heartbeats into Members, decoding a member's record
// only when its bytes differ from that member's previous heartbeat. It is
// used by one goroutine (the NATS subscription's).
type announceDecoder struct {
	last map[string]decodedRecord
	rec  []byte
}

type decodedRecord struct {
	rec string
	m   Member
}

// decode checks a heartbeat from id (the id its subject names) and returns
// its member, with Member.record set so that the view compares records by
// their bytes.
func (d *announceDecoder) decode(id string, b []byte) (Member, error) {
	rec, beat, err := splitAnnounce(b, d.rec)
	if err != nil {
		return Member{}, err
	}
	d.rec = rec
	if c, ok := d.last[id]; ok && c.rec == string(rec) {
		m := c.m
		m.Load, m.HeartbeatInterval = beat.load, beat.interval
		return m, nil
	}
	m, err := decodeAnnounce(b)
	if err != nil {
		return Member{}, err
	}
	if m.ID != id {
		return Member{}, fmt.Errorf("announce of %q on the subject of %q", m.ID, id)
	}
	m.record = string(rec)
	if d.last == nil || len(d.last) >= maxDecodeCache {
		d.last = make(map[string]decodedRecord)
	}
	d.last[id] = decodedRecord{rec: m.record, m: m}
	return m, nil
}

// decodeAnnounce unmarshals and checks one announce (a heartbeat or a
// probe's answer), recording its record bytes in the Member.
func decodeAnnounce(b []byte) (Member, error) {
	var a messages.MemberAnnounce
	if err := proto.Unmarshal(b, &a); err != nil {
		return Member{}, fmt.Errorf("announce: %w", err)
	}
	m, err := memberOf(&a)
	if err != nil {
		return Member{}, err
	}
	rec, _, err := splitAnnounce(b, nil)
	if err != nil {
		return Member{}, err
	}
	m.record = string(rec)
	return m, nil
}
