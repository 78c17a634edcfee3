package router

import (
	"strings"
	"testing"
)

func TestParseClientChecksSamplingRanges(t *testing.T) {
	for body, param := range map[string]string{
		`"temperature":-5`:              "temperature",
		`"temperature":"hot"`:           "temperature",
		`"top_p":0`:                     "top_p",
		`"top_p":1.5`:                   "top_p",
		`"top_k":-2`:                    "top_k",
		`"top_k":2.5`:                   "top_k",
		`"min_p":1.1`:                   "min_p",
		`"presence_penalty":2.5`:        "presence_penalty",
		`"frequency_penalty":-3`:        "frequency_penalty",
		`"repetition_penalty":0`:        "repetition_penalty",
		`"min_tokens":-1`:               "min_tokens",
		`"min_tokens":9,"max_tokens":4`: "min_tokens",
		// accepted
		`"temperature":0`:                 "",
		`"temperature":2.5`:               "",
		`"top_p":1,"top_k":-1,"min_p":0`:  "",
		`"top_k":0,"presence_penalty":-2`: "",
		`"repetition_penalty":1.2`:        "",
		`"min_tokens":4,"max_tokens":4`:   "",
		`"temperature":null,"top_p":null`: "",
	} {
		_, e := ParseClient(Completions, []byte(`{"model":"m","prompt":"p",`+body+`}`))
		switch {
		case param == "" && e != nil:
			t.Errorf("%s: refused: %s", body, e.Message)
		case param != "" && (e == nil || e.Param == nil || *e.Param != param || e.Status != 400):
			t.Errorf("%s: want 400 naming %s, got %+v", body, param, e)
		case param != "" && !strings.Contains(e.Message, param):
			t.Errorf("%s: message %q does not name %s", body, e.Message, param)
		}
	}
}
