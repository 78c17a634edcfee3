package router

import (
	"encoding/json"
	"fmt"
	"iter"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// extrasSeeds are engine chunks with extras, odd ones included.
var extrasSeeds = []string{
	`{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"t1","type":"function","index":0,"function":{"name":"f","arguments":""}}]},"logprobs":null,"finish_reason":null,"token_ids":[1]}]}`,
	`{"choices":[{"index":0,"delta":{"reasoning":"why <not>"},"finish_reason":null,"token_ids":[2]}]}`,
	`{"choices":[{"index":0,"delta":{"reasoning_content":"old name"},"finish_reason":null}]}`,
	`{"choices":[{"index":0,"text":" a","logprobs":{"text_offset":[0],"token_logprobs":[-0.5],"tokens":[" a"],"top_logprobs":[{" a":-0.5}]},"finish_reason":null,"token_ids":[3]}]}`,
	`{"choices":[{"index":0,"delta":{"content":"a"},"logprobs":{"content":[{"token":"a","logprob":-0.1,"bytes":[97],"top_logprobs":[]}]},"finish_reason":"stop"}]}`,
	`{"choices":[{"delta":{"reasoning":null,"reasoning_content":null,"tool_calls":null,"content":"x"},"logprobs":null}]}`,
	`{"choices":[{"Logprobs":{"a":1},"text":"x"}]}`, `{"choices":[{"logprobs":{"a":1},"logprobs":null,"text":"x"}]}`,
	`{"choices":[{"delta":{"Tool_Calls":[]}}]}`, `{"choices":[{"delta":{"reasoning":"a","reasoning":"b"}}]}`,
	`{"choices":[{"delta":{"tool_calls":[]},"logprobs":5}]}`, "{\"choices\":[{\"logprobs\":{\"tokens\":[\"bad \xff\"]}}]}",
	"{\"choices\":[{\"logprobs\" : {\n \"tokens\" : [ \"\u2028\" ] } }]}",
}

// TestParseChunkKeepsExtras: a chunk with extras leaves the fast path and
// keeps them, compact, as encoding/json reads them; a chunk whose extras
// are null stays on the fast path, with none.
func TestParseChunkKeepsExtras(t *testing.T) {
	for _, s := range extrasSeeds {
		checkChunk(t, []byte(s))
	}
	p := jsonParsers.Get()
	defer jsonParsers.Put(p)
	if _, fast := fastChunk(p, []byte(extrasSeeds[0])); fast {
		t.Fatal("a chunk with tool calls took the fast path, which drops them")
	}
	if ch, fast := fastChunk(p, []byte(extrasSeeds[5])); !fast || ch.extras() != nil {
		t.Fatalf("a chunk with null extras: fast %v, extras %+v", fast, ch)
	}
	for _, c := range []struct {
		seed int
		get  func(*engineChoice) extraJSON
		want string
	}{
		{0, func(x *engineChoice) extraJSON { return x.Delta.ToolCalls }, `[{"id":"t1","type":"function","index":0,"function":{"name":"f","arguments":""}}]`},
		{1, func(x *engineChoice) extraJSON { return x.Delta.Reasoning }, `"why \u003cnot\u003e"`},
		{2, func(x *engineChoice) extraJSON { return x.Delta.ReasoningContent }, `"old name"`},
		{4, func(x *engineChoice) extraJSON { return x.Logprobs }, `{"content":[{"token":"a","logprob":-0.1,"bytes":[97],"top_logprobs":[]}]}`},
		{11, func(x *engineChoice) extraJSON { return x.Logprobs }, `{"tokens":["bad ` + "\uFFFD" + `"]}`},
		{12, func(x *engineChoice) extraJSON { return x.Logprobs }, `{"tokens":["\u2028"]}`},
	} {
		ch, err := parseChunk([]byte(extrasSeeds[c.seed]))
		if err != nil {
			t.Fatal(err)
		}
		x := ch.extras()
		if x == nil || string(c.get(x)) != c.want || !utf8.ValidString(string(c.get(x))) {
			t.Fatalf("seed %d: extras %+v, want %s", c.seed, x, c.want)
		}
	}
}

// refDelta, refChoice and refChunk are a streamed chunk with extras as
// encoding/json writes it, for the hand-built event to match.
type refDelta struct {
	Content          *string         `json:"content,omitempty"`
	Reasoning        json.RawMessage `json:"reasoning,omitempty"`
	ReasoningContent json.RawMessage `json:"reasoning_content,omitempty"`
	ToolCalls        json.RawMessage `json:"tool_calls,omitempty"`
}

type refChoice struct {
	Index        int             `json:"index"`
	Text         *string         `json:"text,omitempty"`
	Delta        *refDelta       `json:"delta,omitempty"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	TokenIDs     *[]uint32       `json:"token_ids,omitempty"`
}

type refChunk struct {
	ID      string      `json:"id"`
	Object  string      `json:"object"`
	Created int64       `json:"created"`
	Model   string      `json:"model"`
	Choices []refChoice `json:"choices"`
}

// TestExtrasEventIsEncodingJSONs: a streamed chunk with extras is byte for
// byte what encoding/json writes for it, the engine's values compacted and
// escaped as it does; a chat delta has content only where the engine's had.
func TestExtrasEventIsEncodingJSONs(t *testing.T) {
	raws := []string{``, `null`, `"r <&> \u2028"`, "[ {\"index\" : 0,\n \"function\":{\"arguments\":\"{\\\"a\\\": 1}\"}} ]", `{"content":[]}`}
	fin := "tool_calls"
	for _, kind := range []Kind{Completions, Chat} {
		for _, ret := range []bool{false, true} {
			for i, raw := range raws {
				for _, content := range []*string{nil, new(string), &raws[2]} {
					lp, rs, tc := raw, raws[(i+1)%len(raws)], raws[(i+3)%len(raws)]
					data := `{"choices":[{"delta":{`
					if kind == Completions {
						data = `{"choices":[{"text":"t","delta":{`
					}
					if content != nil && kind == Chat {
						data += `"content":` + string(mustJSON(*content)) + ","
					}
					data += `"reasoning":` + orNull(rs) + `,"tool_calls":` + orNull(tc) + `},"logprobs":` + orNull(lp) + `,"token_ids":[5]}]}`
					ch, err := parseChunk([]byte(data))
					if err != nil {
						t.Fatalf("%s: %v", data, err)
					}
					x := ch.extras()
					if x == nil {
						continue // a plain chunk: TestTokenEventIsEncodingJSONs
					}
					e := newEmitter(httptest.NewRecorder(), &ClientRequest{Kind: kind, Model: "m<", Stream: true, ReturnTokenIDs: ret}, "cmpl-1", 1)
					if !e.carries(x) {
						continue // delta extras on a completion: not relayed
					}
					text := ch.text()
					ref := refChoice{FinishReason: &fin, Logprobs: rawOrNil(lp)}
					if kind == Chat {
						ref.Delta = &refDelta{Reasoning: rawOrNil(rs), ToolCalls: rawOrNil(tc)}
						if content != nil {
							ref.Delta.Content = &text
						}
					} else {
						ref.Text = &text
					}
					if ret {
						ref.TokenIDs = &x.TokenIDs
					}
					want, _ := json.Marshal(refChunk{ID: "cmpl-1", Object: e.object(true), Created: 1, Model: "m<", Choices: []refChoice{ref}})
					if got := string(e.event(nil, text, x.TokenIDs, &fin, x)); got != "data: "+string(want)+"\n\n" {
						t.Fatalf("%s:\n got %s\nwant data: %s", data, got, want)
					}
				}
			}
		}
	}
}

func orNull(raw string) string {
	if raw == "" {
		return "null"
	}
	return raw
}

func rawOrNil(raw string) json.RawMessage {
	if raw == "" || raw == "null" {
		return nil
	}
	return json.RawMessage(raw)
}

// sseChunks reads a streamed answer: its chunks, decoded, and its [DONE]s.
func sseChunks(t *testing.T, answer string) (chunks []map[string]any, dones int) {
	t.Helper()
	for ev := range strings.SplitSeq(strings.TrimSpace(answer), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok {
			t.Fatalf("event %q", ev)
		}
		if data == "[DONE]" {
			dones++
			continue
		}
		var ch map[string]any
		if err := json.Unmarshal([]byte(data), &ch); err != nil {
			t.Fatalf("chunk %q: %v", data, err)
		}
		chunks = append(chunks, ch)
	}
	return chunks, dones
}

// decoded is s decoded as JSON.
func decoded(t *testing.T, s string) any {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return v
}

// choice0 is the first choice of a decoded chunk or answer.
func choice0(t *testing.T, ch any) map[string]any {
	t.Helper()
	cs, _ := ch.(map[string]any)["choices"].([]any)
	if len(cs) != 1 {
		t.Fatalf("choices of %v", ch)
	}
	return cs[0].(map[string]any)
}

// checkStreamed streams script through the router and checks that each
// engine chunk (but a chat's first, the role chunk, for which the router
// sends its own) comes out as one chunk whose choice has the engine's delta
// (chat) or text, logprobs, finish reason and token ids, field for field.
func checkStreamed(t *testing.T, path, body string, script []string) {
	t.Helper()
	status, answer := post(t, scriptRouter(t, script...), path, body)
	chunks, dones := sseChunks(t, answer)
	if status != http.StatusOK || dones != 1 || len(chunks) == 0 {
		t.Fatalf("status %d, %d [DONE]: %s", status, dones, answer)
	}
	engine := script
	if path == chatPath {
		if choice0(t, chunks[0])["delta"].(map[string]any)["role"] != "assistant" {
			t.Fatalf("first chunk %v", chunks[0])
		}
		chunks, engine = chunks[1:], script[1:]
	}
	if len(chunks) != len(engine) {
		t.Fatalf("%d chunks for %d engine chunks:\n%s", len(chunks), len(engine), answer)
	}
	for i, ch := range chunks {
		in, out := choice0(t, decoded(t, engine[i])), choice0(t, ch)
		for _, key := range []string{"delta", "text", "logprobs", "finish_reason", "token_ids"} {
			if key == "token_ids" && !strings.Contains(body, `"return_token_ids":true`) {
				continue
			}
			if !reflect.DeepEqual(in[key], out[key]) {
				t.Fatalf("chunk %d: %s is %v, the engine sent %v\n%s", i, key, out[key], in[key], answer)
			}
		}
	}
}

// whole posts body (not streamed) through a router in front of script and
// returns the answer's choice.
func whole(t *testing.T, path, body string, script []string) map[string]any {
	t.Helper()
	status, answer := post(t, scriptRouter(t, script...), path, body)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, answer)
	}
	return choice0(t, decoded(t, answer))
}

const (
	chatPath = "/v1/chat/completions"
	compPath = "/v1/completions"
	roleCh   = `{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`
	tools    = `"tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}]`
)

// toolScript is vLLM's stream of two tool calls, the first one's arguments
// in fragments, after text if text is not "".
func toolScript(text string) []string {
	s := []string{roleCh}
	if text != "" {
		s = append(s, `{"choices":[{"index":0,"delta":{"content":`+string(mustJSON(text))+`},"logprobs":null,"finish_reason":null,"token_ids":[10]}]}`)
	}
	return append(s,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-a1","type":"function","index":0,"function":{"name":"get_weather"}}]},"logprobs":null,"finish_reason":null,"token_ids":[11,12]}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": \""}}]},"logprobs":null,"finish_reason":null,"token_ids":[13]}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"Paris <&>\"}"}}]},"logprobs":null,"finish_reason":null,"token_ids":[14]}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-b2","type":"function","index":1,"function":{"name":"get_time","arguments":"{}"}}]},"logprobs":null,"finish_reason":null,"token_ids":[15]}]}`,
		`{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":""}}]},"logprobs":null,"finish_reason":"tool_calls","stop_reason":null,"token_ids":[]}]}`,
	)
}

// wantCalls is the message.tool_calls toolScript's calls make.
const wantCalls = `[{"id":"chatcmpl-tool-a1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris <&>\"}"}},
	{"id":"chatcmpl-tool-b2","type":"function","function":{"name":"get_time","arguments":"{}"}}]`

// TestToolCallsRelayed: a chat's tool call deltas reach a streaming client
// field for field, with finish_reason tool_calls; a non-streamed answer
// has them merged into message.tool_calls, content null without text as
// vLLM answers ("" when the request forced a tool call).
func TestToolCallsRelayed(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":50,` + tools
	for _, text := range []string{"", "Let me check."} {
		checkStreamed(t, chatPath, body+`,"stream":true,"return_token_ids":true}`, toolScript(text))
	}
	for _, c := range []struct {
		choice, text string
		content      any
		ids          int
	}{
		{`"auto"`, "", nil, 5},
		{`"auto"`, "Let me check.", "Let me check.", 6},
		{`"required"`, "", "", 5},
		{`{"type":"function","function":{"name":"get_weather"}}`, "", "", 5},
	} {
		ch := whole(t, chatPath, body+`,"tool_choice":`+c.choice+`,"return_token_ids":true}`, toolScript(c.text))
		msg := ch["message"].(map[string]any)
		if content, ok := msg["content"]; !ok || content != c.content || !reflect.DeepEqual(msg["tool_calls"], decoded(t, wantCalls)) ||
			ch["finish_reason"] != "tool_calls" || len(ch["token_ids"].([]any)) != c.ids {
			t.Fatalf("tool_choice %s, text %q: choice %v, want content %#v", c.choice, c.text, ch, c.content)
		}
	}
}

// TestReasoningRelayed: reasoning fragments (vLLM 0.32's reasoning, or
// reasoning_content) reach a streaming client on their chunks, and a
// non-streamed answer has them concatenated into the message, its content
// null when there was no text, as vLLM answers.
func TestReasoningRelayed(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":50`
	for _, field := range []string{"reasoning", "reasoning_content"} {
		script := []string{roleCh,
			`{"choices":[{"index":0,"delta":{"` + field + `":"Think"},"logprobs":null,"finish_reason":null,"token_ids":[1]}]}`,
			`{"choices":[{"index":0,"delta":{"` + field + `":"ing \u2028 <x>"},"finish_reason":null,"token_ids":[2]}]}`,
			`{"choices":[{"index":0,"delta":{"content":"Answer"},"finish_reason":null,"token_ids":[3]}]}`,
			`{"choices":[{"index":0,"delta":{"content":"."},"finish_reason":"stop","token_ids":[4]}]}`,
		}
		checkStreamed(t, chatPath, body+`,"stream":true}`, script)
		msg := whole(t, chatPath, body+`}`, script)["message"].(map[string]any)
		if msg[field] != "Thinking \u2028 <x>" || msg["content"] != "Answer." || len(msg) != 3 {
			t.Fatalf("%s: message %v", field, msg)
		}
		// Cut off while reasoning: no text, content null.
		msg = whole(t, chatPath, body+`}`, script[:3])["message"].(map[string]any)
		if content, ok := msg["content"]; !ok || content != nil || msg[field] != "Thinking \u2028 <x>" {
			t.Fatalf("%s, reasoning only: message %v", field, msg)
		}
	}
}

// TestLogprobsRelayed: logprobs reach a streaming client on their chunks,
// and a non-streamed answer has each list concatenated, in vLLM's shape
// for the endpoint.
func TestLogprobsRelayed(t *testing.T) {
	comp := []string{
		`{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" a","logprobs":{"text_offset":[0],"token_logprobs":[-0.25],"tokens":[" a"],"top_logprobs":[{" a":-0.25,"<b>":-1.5}]},"finish_reason":null,"token_ids":[7]}]}`,
		`{"choices":[{"index":0,"text":"","logprobs":{"text_offset":[],"token_logprobs":[],"tokens":[],"top_logprobs":[]},"finish_reason":null,"token_ids":[8]}]}`,
		`{"choices":[{"index":0,"text":" c","logprobs":{"text_offset":[2],"token_logprobs":[null],"tokens":[" c"],"top_logprobs":[null]},"finish_reason":"length","token_ids":[9]}]}`,
	}
	body := `{"model":"m","prompt":"abc","max_tokens":3,"logprobs":2`
	checkStreamed(t, compPath, body+`,"stream":true,"return_token_ids":true}`, comp)
	ch := whole(t, compPath, body+`}`, comp)
	if want := `{"text_offset":[0,2],"token_logprobs":[-0.25,null],"tokens":[" a"," c"],"top_logprobs":[{" a":-0.25,"<b>":-1.5},null]}`; !reflect.DeepEqual(ch["logprobs"], decoded(t, want)) || ch["text"] != " a c" {
		t.Fatalf("completion choice %v, want logprobs %s", ch, want)
	}

	chat := []string{roleCh,
		`{"choices":[{"index":0,"delta":{"content":"a"},"logprobs":{"content":[{"token":"a","logprob":-0.1,"bytes":[97],"top_logprobs":[{"token":"a","logprob":-0.1,"bytes":[97]}]}]},"finish_reason":null,"token_ids":[7]}]}`,
		`{"choices":[{"index":0,"delta":{"content":"b"},"logprobs":{"content":[{"token":"b","logprob":-0.2,"bytes":[98],"top_logprobs":[]}]},"finish_reason":"stop","token_ids":[8]}]}`,
	}
	body = `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"logprobs":true,"top_logprobs":1`
	checkStreamed(t, chatPath, body+`,"stream":true}`, chat)
	ch = whole(t, chatPath, body+`}`, chat)
	want := `{"content":[{"token":"a","logprob":-0.1,"bytes":[97],"top_logprobs":[{"token":"a","logprob":-0.1,"bytes":[97]}]},{"token":"b","logprob":-0.2,"bytes":[98],"top_logprobs":[]}]}`
	if !reflect.DeepEqual(ch["logprobs"], decoded(t, want)) || ch["message"].(map[string]any)["content"] != "ab" {
		t.Fatalf("chat choice %v, want logprobs %s", ch, want)
	}
}

// TestGatheredToolCallsFollowIndex: deltas of several calls interleaved
// merge by index, and the calls come out in index order.
func TestGatheredToolCallsFollowIndex(t *testing.T) {
	var a answerExtras
	for _, tc := range []string{
		`[{"index":1,"id":"b","type":"function","function":{"name":"g","arguments":"["}}]`,
		`[{"index":0,"id":"a","function":{"name":"f","arguments":"{"}},{"index":1,"function":{"arguments":"1"}}]`,
		`[{"index":0,"id":"ignored","function":{"name":"ignored","arguments":"}"}},{"index":1,"function":{"arguments":"]"}}]`,
	} {
		x := &engineChoice{}
		x.Delta.ToolCalls = extraJSON(tc)
		if err := a.add(Chat, x); err != nil {
			t.Fatal(err)
		}
	}
	ch := outChoice{Message: &answerMessage{Role: "assistant", Content: new(string)}}
	a.fill(&ch, &ClientRequest{Kind: Chat, Body: map[string]json.RawMessage{}})
	got, _ := json.Marshal(ch.Message)
	if want := `{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},{"id":"b","type":"function","function":{"name":"g","arguments":"[1]"}}]}`; string(got) != want {
		t.Fatalf("message %s\nwant    %s", got, want)
	}
}

// TestExtrasFloodIsCut: an engine that sends a non-streamed answer more
// extras than maxExtrasBytes, or extras the answer cannot hold, has the
// answer end with engine_failed, and its stream is left unread.
func TestExtrasFloodIsCut(t *testing.T) {
	big := strings.Repeat("x", 1<<20)
	// Chunks sent: more than the router reads ahead (16 events) and the
	// connection's buffers hold, so that an engine read to its end fails.
	const small = 200000
	manyCalls := func() string { // one event of calls that cost the bound in bookkeeping
		var b strings.Builder
		b.WriteString(`{"choices":[{"index":0,"delta":{"tool_calls":[`)
		for i := range maxExtrasBytes/toolCallCost + 1 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"index":%d}`, i)
		}
		b.WriteString(`]},"finish_reason":null,"token_ids":[1]}]}`)
		return b.String()
	}
	for _, c := range []struct {
		name, path, body, chunk, msg string
		n                            int
	}{
		{"reasoning", chatPath, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`,
			`{"choices":[{"index":0,"delta":{"reasoning":"` + big + `"},"finish_reason":null,"token_ids":[1]}]}`, "bytes of logprobs", 64},
		{"logprobs", compPath, `{"model":"m","prompt":"abc","max_tokens":100,"logprobs":1}`,
			`{"choices":[{"index":0,"text":"a","logprobs":{"tokens":["` + big + `"]},"finish_reason":null,"token_ids":[1]}]}`, "bytes of logprobs", 64},
		{"tool-calls", chatPath, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100,` + tools + `}`,
			manyCalls(), "bytes of logprobs", 64},
		{"no-index", chatPath, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100,` + tools + `}`,
			`{"choices":[{"index":0,"delta":{"tool_calls":[{"id":"x"}]},"finish_reason":null,"token_ids":[1]}]}`, "without an index", small},
		{"reasoning-not-text", chatPath, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":100}`,
			`{"choices":[{"index":0,"delta":{"reasoning":{"a":1}},"finish_reason":null,"token_ids":[1]}]}`, "not a string", small},
	} {
		t.Run(c.name, func(t *testing.T) {
			sent, ended := 0, make(chan struct{})
			flood := iter.Seq[string](func(yield func(string) bool) {
				defer close(ended)
				for range c.n {
					if !yield(c.chunk) {
						return
					}
					sent++
				}
			})
			p := (&fakeEngine{t: t, id: "p", role: "prefill"}).start()
			s := newTestRouter(t, p, scriptEngine(t, "d", flood))
			status, answer := post(t, s, c.path, c.body)
			var e struct{ Error APIError }
			if err := json.Unmarshal([]byte(answer), &e); err != nil || status != http.StatusBadGateway ||
				e.Error.Code != CodeEngineFailed || !strings.Contains(e.Error.Message, c.msg) || !strings.Contains(e.Error.Message, "decode engine d") {
				t.Fatalf("status %d: %.300s", status, answer)
			}
			select {
			case <-ended:
			case <-time.After(10 * time.Second):
				t.Fatal("the engine's stream was still being read 10 s after the answer failed")
			}
			if sent == c.n {
				t.Fatalf("the engine sent all %d chunks: the router read on after the answer failed", c.n)
			}
		})
	}
}

// FuzzParseChunkExtras: chunks with extras read as encoding/json reads
// them, and what the router keeps of them is valid, compact JSON.
func FuzzParseChunkExtras(f *testing.F) {
	for _, s := range extrasSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		checkChunk(t, data)
		ch, err := parseChunk(data)
		if err != nil || len(ch.Choices) == 0 {
			return
		}
		x := &ch.Choices[0]
		for _, v := range []extraJSON{x.Logprobs, x.Delta.Reasoning, x.Delta.ReasoningContent, x.Delta.ToolCalls} {
			if v != "" && (!json.Valid([]byte(v)) || !utf8.ValidString(string(v)) || strings.ContainsAny(string(v), "\n\r")) {
				t.Fatalf("%q: kept %q", data, v)
			}
		}
	})
}
