package router

import (
	"reflect"
	"testing"
)

var bodySeeds = []string{
	`{"model":"m","prompt":"hello there","max_tokens":16,"stream":true}`,
	` { "model" : "m" , "prompt" : [1, 2,3], "temperature": 0.50, "stop": null, "n": 1e0 } `,
	`{"model":"m","messages":[{"role":"user","content":"hi <b> & \u00e9","content":"again"}]}`,
	`{"prompt":"a\"b\\c\/d\n\u2028 \ud800","model":"é"}`,
	`{"model":"m","model":"n"}`, `{"model":"m","\u006dodel":"n"}`, `{"a":{"b":1,"b":2},"c":[{},[]]}`,
	`{}`, ` {} `, `[]`, `"x"`, `{"a":1} x`, `{"a":1}{"b":2}`, `{"a":}`, `{"a":1,}`, `{"a" 1}`, ``, `{`,
	`{"a":"\u0000"}`, "{\"a\":\"bad \xff utf8\"}", `{"a":"x,y","b":"{[","c":"]}\\"}`, `{"a":-0.0,"b":1E+2,"c":true,"d":false}`,
	`{"k1":1,"k2":2,"k3":3,"k4":4,"k5":5,"k6":6,"k7":7,"k8":8,"k9":9,"k10":10}`,
}

// checkBody: the fast reading of a client's body gives what the token by
// token reading gives, whenever it takes the body at all.
func checkBody(t *testing.T, data []byte) {
	want, werr := decodeObjectTokens(data)
	got, ok := decodeObjectFast(data)
	if !ok {
		return // decodeObject reads it token by token
	}
	if werr != nil {
		t.Fatalf("%q: the fast path took a body the reference refuses: %v", data, werr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("%q:\nfast      %q\nreference %q", data, got, want)
	}
}

// TestDecodeObjectFastIsTheTokenReading: the fast path agrees with the
// reference and takes the common bodies.
func TestDecodeObjectFastIsTheTokenReading(t *testing.T) {
	for _, s := range bodySeeds {
		checkBody(t, []byte(s))
	}
	for _, s := range bodySeeds[:4] {
		if _, ok := decodeObjectFast([]byte(s)); !ok {
			t.Fatalf("%s: not taken by the fast path", s)
		}
	}
	for _, s := range []string{`{"model":"m","model":"n"}`, `{"model":"m","\u006dodel":"n"}`, `{"a":1} x`} {
		if _, ok := decodeObjectFast([]byte(s)); ok {
			t.Fatalf("%s: taken by the fast path", s)
		}
	}
}

func FuzzDecodeObjectFast(f *testing.F) {
	for _, s := range bodySeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) { checkBody(t, data) })
}
