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
