package router

import (
	"bytes"

	"github.com/valyala/fastjson"
)

// parseStrict parses data with p where fastjson reads it as encoding/json
// would, and ok is false for anything else (the caller's encoding/json
// path then reads it and reports its errors). fastjson's parser takes
// some of what encoding/json refuses: a control byte or an unknown escape
// in a string, and numbers such as 01, 1. or NaN. Data with neither
// control bytes nor escapes (an engine's common answer) is parsed and its
// numbers checked; data with escapes goes through fastjson's validator
// first; data with a control byte (which that validator misses after an
// escape) is refused. A \u escape fastjson decodes its own way when it is
// a bad surrogate pair, so it is refused too.
func parseStrict(p *fastjson.Parser, data []byte) (v *fastjson.Value, ok bool) {
	plain, control := plainText(data)
	if control || !plain && (fastjson.ValidateBytes(data) != nil || bytes.Contains(data, []byte(`\u`))) {
		return nil, false
	}
	v, err := p.ParseBytes(data)
	if err != nil {
		return nil, false
	}
	if plain {
		var scratch [32]byte
		if !strictNumbers(v, scratch[:0]) {
			return nil, false
		}
	}
	return v, true
}

// plainText reports whether data has no byte that fastjson's parser reads
// more leniently than encoding/json inside a string: plain when it has no
// backslash (an escape) and no control byte, control when it has a
// control byte (JSON allows only tab, LF and CR, and those only between
// tokens). In plain data every string is its raw bytes, and only numbers
// are left for strictNumbers to check.
func plainText(data []byte) (plain, control bool) {
	plain = true
	for _, c := range data {
		switch {
		case c < 0x20:
			return false, true
		case c == '\\':
			plain = false
		}
	}
	return plain, false
}

// strictNumbers reports whether every number in v is written as JSON
// (RFC 8259) writes numbers: fastjson's parser also takes 01, 1., .5,
// +1, NaN and Inf, which encoding/json refuses.
// scratch is a buffer for a number's text (it is written over).
func strictNumbers(v *fastjson.Value, scratch []byte) bool {
	switch v.Type() {
	case fastjson.TypeNumber:
		return jsonNumber(v.MarshalTo(scratch[:0]))
	case fastjson.TypeArray:
		a, _ := v.Array()
		for _, e := range a {
			if !strictNumbers(e, scratch) {
				return false
			}
		}
	case fastjson.TypeObject:
		o, _ := v.Object()
		ok := true
		o.Visit(func(_ []byte, e *fastjson.Value) {
			ok = ok && strictNumbers(e, scratch)
		})
		return ok
	}
	return true
}

// jsonNumber reports whether b is a number in JSON's grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func jsonNumber(b []byte) bool {
	i := 0
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i == len(b) || b[i] < '0' || b[i] > '9' {
			return false
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i == len(b) || b[i] < '0' || b[i] > '9' {
			return false
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	return i == len(b)
}
