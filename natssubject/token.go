// Package natssubject decides what may stand as one token of a NATS subject in
// Connex's API: member, engine and cluster ids are spliced into subjects,
// credentials and inbox prefixes, so every layer that accepts an id checks
// it with the same rule. Pure: no I/O.
package natssubject

import (
	"unicode"
	"unicode/utf8"
)

// MaxTokenLen is the longest id, in bytes, that ValidToken accepts.
const MaxTokenLen = 128

// ReservedMemberID may not name a member: connex.v1.engine.<member>.<engine>
// are the engines' notice subjects, so an engine credential of a member
// named "engine" (which may publish on connex.v1.engine.e.<engine>.>) could
// forge the notices of an engine on a member named "e".
const ReservedMemberID = "engine"

// ValidToken reports whether s can be used as one subject token (member,
// engine and cluster ids): non-empty, at most MaxTokenLen bytes of
// printable UTF-8, with no whitespace, control characters, '.', '*' or '>'.
func ValidToken(s string) bool {
	if s == "" || len(s) > MaxTokenLen || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r == 0x7f || r == '.' || r == '*' || r == '>' || !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}
