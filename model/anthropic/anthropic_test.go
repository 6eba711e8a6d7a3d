package anthropic_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/fakellm"
	"github.com/timebox-run/timebox/internal/providertest"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/anthropic"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func provider(s *fakellm.Server) *anthropic.Provider {
	return anthropic.New(anthropic.Options{BaseURL: s.BaseURL(), APIKey: "sk-ant-test"})
}

func TestTextStreamsEventByEvent(t *testing.T) {
	s := fakellm.New(fakellm.Anthropic, fakellm.Text("hello there world", 0))
	defer s.Close()
	chunks, resp, err := providertest.Collect(t, provider(s), model.Request{Model: "claude-x", Messages: []model.Message{{Role: model.RoleUser, Content: "hi"}}})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	for _, c := range chunks {
		text.WriteString(c.Text)
	}
	// message_start, content_block_start, three text deltas,
	// content_block_stop, message_delta, message_stop: each is a chunk.
	if len(chunks) != 8 || text.String() != "hello there world" || resp.Text != "hello there world" || resp.FinishReason != "end_turn" {
		t.Fatalf("chunks %+v resp %+v", chunks, resp)
	}
	// input from message_start, output as message_delta's cumulative count
	if resp.Usage != (model.Usage{InputTokens: 10, OutputTokens: 15}) {
		t.Errorf("usage %+v", resp.Usage)
	}
	if r := s.Requests()[0]; r.Path != "/v1/messages" || r.Authorization != "Bearer sk-ant-test" || r.Model != "claude-x" || r.Body["stream"] != true {
		t.Fatalf("request %+v", r)
	}
}

func TestToolUseAssemblesFromInputJSONDeltas(t *testing.T) {
	two := fakellm.Reply{Chunks: []fakellm.Chunk{
		{Text: "Let me look."},
		{Tool: &fakellm.ToolFragment{ID: "toolu_1", Name: "crawl"}},
		{Tool: &fakellm.ToolFragment{Arguments: `{"url": "https://`}},
		{Tool: &fakellm.ToolFragment{Arguments: `example.org"}`}},
		{Tool: &fakellm.ToolFragment{ID: "toolu_2", Name: "noargs"}},
	}}
	bad := fakellm.ToolCall("toolu_9", "broken", `{"url": `, 3)
	s := fakellm.New(fakellm.Anthropic, two, bad)
	defer s.Close()
	p := provider(s)

	_, resp, err := providertest.Collect(t, p, model.Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	want := []model.ToolCall{{ID: "toolu_1", Name: "crawl", Arguments: `{"url": "https://example.org"}`}, {ID: "toolu_2", Name: "noargs", Arguments: "{}"}}
	if resp.Text != "Let me look." || resp.FinishReason != "tool_use" || len(resp.ToolCalls) != 2 || resp.ToolCalls[0] != want[0] || resp.ToolCalls[1] != want[1] {
		t.Fatalf("resp %+v", resp)
	}
	// Cut-off arguments are passed on as they came: the turn loop tells the
	// model they are not JSON.
	_, resp, err = providertest.Collect(t, p, model.Request{Model: "m"})
	if err != nil || len(resp.ToolCalls) != 1 || resp.ToolCalls[0].Arguments != `{"url": ` {
		t.Fatalf("resp %+v err %v", resp, err)
	}
}

type sentMessage struct {
	Role    string `json:"role"`
	Content []struct {
		Type      string          `json:"type"`
		Text      string          `json:"text"`
		ID        string          `json:"id"`
		Name      string          `json:"name"`
		Input     json.RawMessage `json:"input"`
		ToolUseID string          `json:"tool_use_id"`
		Content   json.RawMessage `json:"content"`
	} `json:"content"`
}

// TestChunksCountToolCallBytes: each chunk says how many bytes of tool-call
// names and arguments it carried, so that limits.max_reply counts them with
// the text.
func TestChunksCountToolCallBytes(t *testing.T) {
	r := fakellm.ToolCall("toolu_1", "crawl", `{"url": "https://example.org"}`, 4)
	r.Chunks = append([]fakellm.Chunk{{Text: "Let me look."}}, r.Chunks...)
	s := fakellm.New(fakellm.Anthropic, r)
	defer s.Close()
	chunks, resp, err := providertest.Collect(t, provider(s), model.Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, c := range chunks {
		n += c.Size()
	}
	if n != resp.Size() || n != int64(len("Let me look.")+len("crawl")+len(`{"url": "https://example.org"}`)) {
		t.Fatalf("chunks add up to %d bytes, the reply is %d: %+v", n, resp.Size(), resp)
	}
}

func sent(t *testing.T, r fakellm.Request) []sentMessage {
	t.Helper()
	b, _ := json.Marshal(r.Body["messages"])
	var msgs []sentMessage
	if err := json.Unmarshal(b, &msgs); err != nil {
		t.Fatalf("messages %s: %v", b, err)
	}
	return msgs
}

func TestRequestMapping(t *testing.T) {
	s := fakellm.New(fakellm.Anthropic, fakellm.Text("ok", 0))
	defer s.Close()
	// A base URL with or without /v1 reaches the same /v1/messages.
	p := anthropic.New(anthropic.Options{BaseURL: s.URL + "/v1/", APIKey: "sk-ant-abc", MaxTokens: 321})
	_, _, err := providertest.Collect(t, p, model.Request{
		Model: "claude-haiku", System: "be brief",
		Messages: []model.Message{
			{Role: model.RoleUser, Content: "count both"},
			{Role: model.RoleAssistant, Content: "On it.", ToolCalls: []model.ToolCall{
				{ID: "c1", Name: "wc", Arguments: `{"text":"a b"}`}, {ID: "c2", Name: "wc", Arguments: `{"text":`}}},
			{Role: model.RoleTool, ToolCallID: "c1", ToolName: "wc", Content: "2"},
			{Role: model.RoleTool, ToolCallID: "c2", ToolName: "wc", Content: "arguments are not JSON"},
			{Role: model.RoleUser, Content: "thanks"},
		},
		Tools: []model.ToolDef{{Name: "wc", Description: "counts", Parameters: json.RawMessage(
			`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}`)},
			{Name: "noargs"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := s.Requests()[0]
	if r.Path != "/v1/messages" || r.Authorization != "Bearer sk-ant-abc" || r.Body["max_tokens"] != 321.0 {
		t.Fatalf("request %+v", r)
	}
	if sys, _ := json.Marshal(r.Body["system"]); !strings.Contains(string(sys), `"text":"be brief"`) {
		t.Errorf("system %s", sys)
	}
	msgs := sent(t, r)
	// user; assistant (text + two tool_use); user (two tool_results and
	// the next message, merged: the roles must alternate).
	if len(msgs) != 3 || msgs[0].Role != "user" || msgs[0].Content[0].Text != "count both" ||
		msgs[1].Role != "assistant" || len(msgs[1].Content) != 3 || msgs[1].Content[0].Text != "On it." ||
		msgs[1].Content[1].Type != "tool_use" || msgs[1].Content[1].ID != "c1" || string(msgs[1].Content[1].Input) != `{"text":"a b"}` ||
		msgs[1].Content[2].Type != "tool_use" || string(msgs[1].Content[2].Input) != `{"_raw":"{\"text\":"}` ||
		msgs[2].Role != "user" || len(msgs[2].Content) != 3 || msgs[2].Content[0].Type != "tool_result" ||
		msgs[2].Content[0].ToolUseID != "c1" || msgs[2].Content[1].ToolUseID != "c2" || msgs[2].Content[2].Text != "thanks" {
		b, _ := json.Marshal(r.Body["messages"])
		t.Fatalf("messages %s", b)
	}
	tb, _ := json.Marshal(r.Body["tools"])
	for _, want := range []string{`"name":"wc"`, `"name":"noargs"`, `"required":["text"]`, `"additionalProperties":false`, `"input_schema":{`} {
		if !strings.Contains(string(tb), want) {
			t.Errorf("tools %s: want %s", tb, want)
		}
	}
}

// A compacted history can open with the assistant; the Messages API wants
// a user message first.
func TestHistoryOpeningWithTheAssistant(t *testing.T) {
	s := fakellm.New(fakellm.Anthropic, fakellm.Text("ok", 0))
	defer s.Close()
	_, _, err := providertest.Collect(t, provider(s), model.Request{Model: "m", Messages: []model.Message{
		{Role: model.RoleAssistant, Content: "Earlier I said so."},
		{Role: model.RoleUser, Content: "go on"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	msgs := sent(t, s.Requests()[0])
	if len(msgs) != 3 || msgs[0].Role != "user" || msgs[1].Role != "assistant" || msgs[2].Role != "user" {
		t.Fatalf("messages %+v", msgs)
	}
}

// The Messages API refuses empty or blank text blocks: a tool that printed
// nothing, an assistant reply that was white space before its tool call,
// and an empty history must still make a request it accepts.
func TestBlankTextIsLeftOut(t *testing.T) {
	s := fakellm.New(fakellm.Anthropic, fakellm.Text("ok", 0))
	defer s.Close()
	p := provider(s)
	_, _, err := providertest.Collect(t, p, model.Request{Model: "m", Messages: []model.Message{
		{Role: model.RoleUser, Content: "touch it"},
		{Role: model.RoleAssistant, Content: "\n\n", ToolCalls: []model.ToolCall{{ID: "c1", Name: "touch", Arguments: "{}"}}},
		{Role: model.RoleTool, ToolCallID: "c1", ToolName: "touch", Content: ""},
	}})
	if err != nil {
		t.Fatal(err)
	}
	msgs := sent(t, s.Requests()[0])
	if len(msgs) != 3 || len(msgs[1].Content) != 1 || msgs[1].Content[0].Type != "tool_use" ||
		len(msgs[2].Content) != 1 || msgs[2].Content[0].Type != "tool_result" || msgs[2].Content[0].ToolUseID != "c1" ||
		msgs[2].Content[0].Content != nil {
		b, _ := json.Marshal(s.Requests()[0].Body["messages"])
		t.Fatalf("messages %s", b)
	}

	if _, _, err := providertest.Collect(t, p, model.Request{Model: "m"}); err != nil {
		t.Fatal(err)
	}
	if msgs := sent(t, s.Requests()[1]); len(msgs) != 1 || msgs[0].Role != "user" || msgs[0].Content[0].Text == "" {
		t.Fatalf("messages %+v", msgs)
	}
}

func TestProviderFailures(t *testing.T) {
	cases := []struct {
		name      string
		reply     fakellm.Reply
		status    int
		rejected  bool
		malformed bool
		retry     time.Duration
		msg       string
	}{
		{"429 with Retry-After", fakellm.Reply{Status: 429, Message: "slow down", RetryAfter: "7"}, 429, false, false, 7 * time.Second, "rate_limit_error: slow down"},
		{"500", fakellm.Reply{Status: 500, Message: "boom"}, 500, false, false, 0, "api_error: boom"},
		{"503", fakellm.Reply{Status: 503, Message: "unavailable"}, 503, false, false, 0, "unavailable"},
		{"529 overloaded", fakellm.Reply{Status: 529, Message: "Overloaded"}, 529, false, false, 0, "overloaded_error: Overloaded"},
		{"400 is a refusal with the provider's reason", fakellm.Reply{Status: 400, Message: "prompt is too long"}, 400, true, false, 0, "prompt is too long"},
		{"401", fakellm.Reply{Status: 401, Message: "invalid x-api-key"}, 401, true, false, 0, "invalid x-api-key"},
		{"403", fakellm.Reply{Status: 403, Message: "no access to this model"}, 403, true, false, 0, "permission_error: no access to this model"},
		{"404", fakellm.Reply{Status: 404, Message: "model: claude-nope"}, 404, true, false, 0, "not_found_error: model: claude-nope"},
		{"422", fakellm.Reply{Status: 422, Message: "unprocessable"}, 422, true, false, 0, "unprocessable"},
		{"408 is retryable", fakellm.Reply{Status: 408, Message: "request timeout"}, 408, false, false, 0, "request timeout"},
		{"connection reset", fakellm.Reply{Reset: true}, 0, false, false, 0, ""},
		{"truncated stream", fakellm.Reply{Chunks: []fakellm.Chunk{{Text: "half"}}, Truncate: true}, 0, false, false, 0, "no message_stop"},
		{"malformed SSE JSON", fakellm.Reply{Chunks: []fakellm.Chunk{{Text: "a"}}, Malformed: true}, 0, false, true, 0, ""},
		{"an event that is a number", fakellm.Reply{Chunks: []fakellm.Chunk{{Text: "a"}}, BadData: "5"}, 0, false, true, 0, "not a JSON object with a type: 5"},
		{"a delta without a type", fakellm.Reply{Chunks: []fakellm.Chunk{{Text: "a"}}, BadData: `{"type": "content_block_delta", "index": 0, "delta": 5}`}, 0, false, true, 0, "content_block_delta"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := fakellm.New(fakellm.Anthropic, tc.reply)
			defer s.Close()
			_, _, err := providertest.Collect(t, provider(s), model.Request{Model: "m"})
			var me *model.Error
			if !errors.As(err, &me) {
				t.Fatalf("err %T %v", err, err)
			}
			if me.Status != tc.status || me.Rejected() != tc.rejected || me.Malformed != tc.malformed || me.RetryAfter != tc.retry ||
				!strings.Contains(me.Message, tc.msg) || model.Phase(err) != budget.PhaseLLMHTTP || me.Provider != "anthropic" {
				t.Fatalf("got %+v", me)
			}
			if strings.Contains(err.Error(), "sk-ant-test") {
				t.Fatalf("the key is in the error: %v", err)
			}
		})
	}
}

// An error event inside a 200 stream (Anthropic sends overloaded_error this
// way) is classified by its type: retryable, not a refusal.
func TestErrorEventInsideTheStream(t *testing.T) {
	s := fakellm.NewFunc(fakellm.Anthropic, func(int, fakellm.Request) fakellm.Reply {
		return fakellm.Reply{Chunks: []fakellm.Chunk{{Text: "a"}}, ErrorEvent: `{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}`}
	})
	defer s.Close()
	_, _, err := providertest.Collect(t, provider(s), model.Request{Model: "m"})
	var me *model.Error
	if !errors.As(err, &me) || me.Status != 529 || me.Rejected() || !strings.Contains(me.Message, "Overloaded") {
		t.Fatalf("err %v (%+v)", err, me)
	}
}

// A refusal sent as an error event (invalid_request_error) is a refusal,
// not something another endpoint may fix.
func TestRefusalEventInsideTheStream(t *testing.T) {
	s := fakellm.New(fakellm.Anthropic, fakellm.Reply{ErrorEvent: `{"type": "error", "error": {"type": "invalid_request_error", "message": "bad tool schema"}}`})
	defer s.Close()
	_, _, err := providertest.Collect(t, provider(s), model.Request{Model: "m"})
	var me *model.Error
	if !errors.As(err, &me) || me.Status != 400 || !me.Rejected() || me.Message != "invalid_request_error: bad tool schema" {
		t.Fatalf("err %v (%+v)", err, me)
	}
}

func TestWatchdogsOnARealStream(t *testing.T) {
	providertest.Watchdogs(t, fakellm.Anthropic, func(s *fakellm.Server) model.Provider { return provider(s) })
}

func TestCancelledContextEndsRecvPromptly(t *testing.T) {
	providertest.CancelEndsRecv(t, fakellm.Anthropic, func(s *fakellm.Server) model.Provider { return provider(s) })
}

func TestTextKeptLeavesTheTextToTheCaller(t *testing.T) {
	providertest.TextKept(t, fakellm.Anthropic, func(s *fakellm.Server) model.Provider { return provider(s) })
}

// "prompt is too long" (400) and request_too_large (413) are refusals
// marked TooLong, so the turn can compact instead of failing; other
// refusals are not.
func TestLengthRefusal(t *testing.T) {
	long := fakellm.New(fakellm.Anthropic, fakellm.Text("never", 0))
	defer long.Close()
	long.LimitContext(100)
	large := fakellm.New(fakellm.Anthropic, fakellm.Reply{Status: 413, Message: "Request exceeds the maximum allowed number of bytes."})
	defer large.Close()
	other := fakellm.New(fakellm.Anthropic, fakellm.Reply{Status: 400, Message: "tools.0.input_schema: JSON schema is invalid"})
	defer other.Close()
	req := model.Request{Model: "m", Messages: []model.Message{{Role: model.RoleUser, Content: strings.Repeat("word ", 200)}}}
	for _, tc := range []struct {
		s       *fakellm.Server
		status  int
		tooLong bool
	}{{long, 400, true}, {large, 413, true}, {other, 400, false}} {
		_, _, err := providertest.Collect(t, provider(tc.s), req)
		var me *model.Error
		if !errors.As(err, &me) || me.Status != tc.status || !me.Rejected() || me.TooLong != tc.tooLong {
			t.Fatalf("err %v (%+v)", err, me)
		}
	}
}

func TestDocumentForAStream(t *testing.T) {
	providertest.DocumentForAStream(t, func(url string) model.Provider {
		return anthropic.New(anthropic.Options{BaseURL: url, APIKey: "sk-test"})
	})
}
