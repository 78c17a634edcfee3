package router

import (
	"bytes"
	"encoding/json"
)

// decodeObjectFast is decodeObject for a well-formed body without repeated
// keys, in two passes of encoding/json over the whole body instead of a
// token stream (most of what parsing a request cost): ok is false for
// anything else, which decodeObjectTokens then reads and reports.
func decodeObjectFast(data []byte) (map[string]json.RawMessage, bool) {
	data = bytes.Trim(data, " \t\r\n") // JSON's whitespace, not Unicode's
	if len(data) == 0 || data[0] != '{' {
		return nil, false
	}
	// Unmarshal checks that all of data is valid JSON before it reads any
	// of it (what members needs), so a json.Valid pass first would be a
	// second validation of every byte.
	var out map[string]json.RawMessage
	if json.Unmarshal(data, &out) != nil || len(out) != members(data) || len(out) > maxKeys {
		return nil, false // a key twice (the map kept one), or too many
	}
	for k, raw := range out {
		if plainScalar(raw) {
			continue // its parsed form encodes to these very bytes
		}
		var v any
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if dec.Decode(&v) != nil {
			return nil, false
		}
		out[k] = mustJSON(v)
	}
	return out, true
}

// members counts the members of the valid JSON object data.
func members(data []byte) int {
	inner := bytes.Trim(data[1:len(data)-1], " \t\r\n")
	if len(inner) == 0 {
		return 0
	}
	n, depth, inString, escaped := 1, 0, false, false
	for _, c := range inner {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
		case c == ',' && depth == 0:
			n++
		}
	}
	return n
}

// plainScalar reports whether raw, a valid JSON value, is one that
// encoding/json writes back byte for byte after decoding it into an any
// with UseNumber: a number (json.Number keeps its text), true, false, null,
// or a string of printable ASCII with nothing to escape.
func plainScalar(raw []byte) bool {
	if len(raw) == 0 {
		return false
	}
	switch c := raw[0]; {
	case c == 't' || c == 'f' || c == 'n' || c == '-' || (c >= '0' && c <= '9'):
		return true
	case c == '"':
		for _, b := range raw[1 : len(raw)-1] {
			if b < 0x20 || b >= 0x80 || b == '\\' || b == '<' || b == '>' || b == '&' || b == '"' {
				return false
			}
		}
		return true
	}
	return false
}
