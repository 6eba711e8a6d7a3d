package fakellm_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/internal/fakellm"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// post sends a Messages request as Anthropic's clients do.
func post(t *testing.T, s *fakellm.Server) *http.Response {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.BaseURL()+"/messages",
		strings.NewReader(`{"model": "claude-x", "max_tokens": 10, "stream": true, "messages": []}`))
	req.Header.Set("X-Api-Key", "sk-ant-k")
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

type sse struct {
	event string
	data  map[string]any
}

// events reads a whole SSE body, checking that each event's name is its
// data's type, as in Anthropic's stream.
func events(t *testing.T, body io.Reader) []sse {
	t.Helper()
	var out []sse
	var name string
	sc := bufio.NewScanner(body)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var d map[string]any
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d); err != nil {
				t.Fatalf("data of %s: %v", name, err)
			}
			if d["type"] != name {
				t.Fatalf("event %s has data of type %v", name, d["type"])
			}
			out = append(out, sse{name, d})
		}
	}
	return out
}

func TestAnthropicStreamsTheMessagesEvents(t *testing.T) {
	s := fakellm.New(fakellm.Anthropic, fakellm.Reply{Chunks: []fakellm.Chunk{
		{Text: "Let me "}, {Text: "look."},
		{Tool: &fakellm.ToolFragment{ID: "toolu_1", Name: "crawl"}},
		{Tool: &fakellm.ToolFragment{Arguments: `{"url":`}},
		{Tool: &fakellm.ToolFragment{Arguments: ` "x"}`}},
	}})
	defer s.Close()
	resp := post(t, s)
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	evs := events(t, resp.Body)
	var names []string
	for _, e := range evs {
		names = append(names, e.event)
	}
	want := "message_start ping content_block_start content_block_delta content_block_delta content_block_stop " +
		"content_block_start content_block_delta content_block_delta content_block_stop message_delta message_stop"
	if strings.Join(names, " ") != want {
		t.Fatalf("events\n got %s\nwant %s", strings.Join(names, " "), want)
	}
	if cb := evs[6].data["content_block"].(map[string]any); cb["type"] != "tool_use" || cb["id"] != "toolu_1" || cb["name"] != "crawl" || evs[6].data["index"] != 1.0 {
		t.Errorf("tool block start %v", evs[6].data)
	}
	if d := evs[8].data["delta"].(map[string]any); d["type"] != "input_json_delta" || d["partial_json"] != ` "x"}` || evs[8].data["index"] != 1.0 {
		t.Errorf("input_json_delta %v", evs[8].data)
	}
	if d := evs[10].data["delta"].(map[string]any); d["stop_reason"] != "tool_use" {
		t.Errorf("message_delta %v", evs[10].data)
	}
	r := s.Requests()
	if len(r) != 1 || r[0].Path != "/v1/messages" || r[0].Model != "claude-x" || r[0].Authorization != "Bearer sk-ant-k" {
		t.Fatalf("requests %+v", r)
	}
}

func TestAnthropicErrorBody(t *testing.T) {
	s := fakellm.New(fakellm.Anthropic, fakellm.Reply{Status: 529, Message: "Overloaded", RetryAfter: "3"})
	defer s.Close()
	resp := post(t, s)
	var body struct {
		Type  string `json:"type"`
		Error struct{ Type, Message string }
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 529 || resp.Header.Get("Retry-After") != "3" ||
		body.Type != "error" || body.Error.Type != "overloaded_error" || body.Error.Message != "Overloaded" {
		t.Fatalf("%d %+v", resp.StatusCode, body)
	}
}

// send posts body to the server's endpoint for its format and returns the
// status and the error message of a refusal.
func send(t *testing.T, s *fakellm.Server, format fakellm.Format, body string) (int, string) {
	t.Helper()
	path := "/chat/completions"
	if format == fakellm.Anthropic {
		path = "/messages"
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, s.BaseURL()+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct {
		Error struct{ Type, Message, Code string }
	}
	if resp.StatusCode != 200 {
		if err := json.NewDecoder(resp.Body).Decode(&e); err != nil {
			t.Fatal(err)
		}
	}
	return resp.StatusCode, e.Error.Type + ": " + e.Error.Message
}

// The fakes refuse what the real APIs refuse: a tool call without its
// result, a result without its call, two results for one call.
func TestToolCallsAndResultsMustPairUp(t *testing.T) {
	oa := `{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}, {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}`
	an := `{"role": "assistant", "content": [{"type": "tool_use", "id": "c1", "name": "f", "input": {}}, {"type": "tool_use", "id": "c2", "name": "f", "input": {}}]}`
	cases := []struct {
		name   string
		format fakellm.Format
		msgs   string
		want   string // "" is accepted
	}{
		{"openai: paired", fakellm.OpenAI, `{"role": "user", "content": "go"}, ` + oa + `, {"role": "tool", "tool_call_id": "c2", "content": "b"}, {"role": "tool", "tool_call_id": "c1", "content": "a"}, {"role": "user", "content": "more"}`, ""},
		{"openai: a call without its result", fakellm.OpenAI, `{"role": "user", "content": "go"}, ` + oa + `, {"role": "tool", "tool_call_id": "c1", "content": "a"}, {"role": "user", "content": "more"}`,
			"invalid_request_error: An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: c2"},
		{"openai: the last message's calls unanswered", fakellm.OpenAI, `{"role": "user", "content": "go"}, ` + oa, "did not have response messages: c1, c2"},
		{"openai: a result without its call", fakellm.OpenAI, `{"role": "user", "content": "go"}, {"role": "tool", "tool_call_id": "c9", "content": "a"}`,
			"messages with role 'tool' must be a response to a preceeding message with 'tool_calls'"},
		{"openai: a result for another call", fakellm.OpenAI, `{"role": "user", "content": "go"}, ` + oa + `, {"role": "tool", "tool_call_id": "c1", "content": "a"}, {"role": "tool", "tool_call_id": "c2", "content": "b"}, {"role": "tool", "tool_call_id": "c9", "content": "c"}`,
			"'tool_call_id' of 'c9' not found in 'tool_calls' of previous message"},
		{"openai: two results for one call", fakellm.OpenAI, `{"role": "user", "content": "go"}, ` + oa + `, {"role": "tool", "tool_call_id": "c1", "content": "a"}, {"role": "tool", "tool_call_id": "c1", "content": "a"}, {"role": "tool", "tool_call_id": "c2", "content": "b"}`,
			"duplicate 'tool_call_id' of 'c1'"},
		{"anthropic: paired", fakellm.Anthropic, `{"role": "user", "content": "go"}, ` + an + `, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c2"}, {"type": "tool_result", "tool_use_id": "c1"}, {"type": "text", "text": "more"}]}`, ""},
		{"anthropic: a call without its result", fakellm.Anthropic, `{"role": "user", "content": "go"}, ` + an + `, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1"}]}`,
			"invalid_request_error: messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: c2."},
		{"anthropic: the last message's calls unanswered", fakellm.Anthropic, `{"role": "user", "content": "go"}, ` + an, "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: c1, c2."},
		{"anthropic: a result without its call", fakellm.Anthropic, `{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c9"}]}`,
			"messages.0.content.0: unexpected `tool_use_id` found in `tool_result` blocks: c9."},
		{"anthropic: two results for one call", fakellm.Anthropic, `{"role": "user", "content": "go"}, ` + an + `, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1"}, {"type": "tool_result", "tool_use_id": "c2"}, {"type": "tool_result", "tool_use_id": "c1"}]}`,
			"messages.2.content.2: each tool_use must have a single result. Found multiple `tool_result` blocks with id: c1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := fakellm.New(tc.format, fakellm.Text("ok", 0))
			defer s.Close()
			status, msg := send(t, s, tc.format, `{"model": "m", "max_tokens": 10, "stream": true, "messages": [`+tc.msgs+`]}`)
			switch {
			case tc.want == "" && status != 200:
				t.Fatalf("refused: %d %s", status, msg)
			case tc.want != "" && (status != 400 || !strings.Contains(msg, tc.want)):
				t.Fatalf("got %d %q, want 400 %q", status, msg, tc.want)
			}
		})
	}
}

// LimitContext refuses a request over the window as each API does.
func TestLimitContext(t *testing.T) {
	for format, want := range map[fakellm.Format]string{
		fakellm.OpenAI:    "invalid_request_error: This model's maximum context length is 50 tokens. However, your messages resulted in",
		fakellm.Anthropic: "invalid_request_error: prompt is too long: ",
	} {
		s := fakellm.New(format, fakellm.Text("ok", 0))
		s.LimitContext(50)
		short := `{"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}`
		if status, msg := send(t, s, format, short); status != 200 {
			t.Errorf("%s: a short request was refused: %s", format, msg)
		}
		long := `{"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "` + strings.Repeat("word ", 100) + `"}]}`
		if status, msg := send(t, s, format, long); status != 400 || !strings.HasPrefix(msg, want) {
			t.Errorf("%s: got %d %q", format, status, msg)
		}
		s.Close()
	}
}
