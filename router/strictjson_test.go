package router

import (
	"encoding/json"
	"testing"
)

// TestJSONNumber: jsonNumber takes exactly the numbers encoding/json takes.
func TestJSONNumber(t *testing.T) {
	for _, s := range []string{"0", "-0", "1", "-1", "10", "1.5", "-0.25", "1e5", "1E+5", "1e-05", "0.0e0", "123456789012345678901234567890",
		"01", "-01", "1.", ".5", "+1", "-", "", "1e", "1e+", "NaN", "nan", "Inf", "-Inf", "0x10", "1_000", "1.2.3", "1ee5", "--1", "00"} {
		var v json.Number
		want := json.Unmarshal([]byte(s), &v) == nil
		if got := jsonNumber([]byte(s)); got != want {
			t.Errorf("jsonNumber(%q) = %v, encoding/json takes it: %v", s, got, want)
		}
	}
}
