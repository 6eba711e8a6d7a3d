package openai_test

import (
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/fakellm"
	"github.com/timebox-run/timebox/internal/providertest"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/openai"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func provider(s *fakellm.Server) *openai.Provider {
	return openai.New(openai.Options{BaseURL: s.BaseURL(), APIKey: "sk-test"})
}

func TestTextStreamsChunkByChunk(t *testing.T) {
	s := fakellm.New(fakellm.OpenAI, fakellm.Text("hello there world", 0))
	defer s.Close()
	chunks, resp, err := providertest.Collect(t, provider(s), model.Request{Model: "gpt-x", Messages: []model.Message{{Role: model.RoleUser, Content: "hi"}}})
	if err != nil {
		t.Fatal(err)
	}
	// three words, the finishing event and the usage: each is a chunk
	if len(chunks) != 5 || chunks[0].Text != "hello " || resp.Text != "hello there world" || resp.FinishReason != "stop" {
		t.Fatalf("chunks %+v resp %+v", chunks, resp)
	}
	// The usage is asked for, and read from its chunk.
	if opts, _ := s.Requests()[0].Body["stream_options"].(map[string]any); opts["include_usage"] != true {
		t.Errorf("stream_options %v: the usage was not asked for", s.Requests()[0].Body["stream_options"])
	}
	if resp.Usage != (model.Usage{InputTokens: 10, OutputTokens: 5}) {
		t.Errorf("usage %+v", resp.Usage)
	}
}

func TestToolCallsAssembleFromFragments(t *testing.T) {
	one := fakellm.ToolCall("call_a", "crawl", `{"url": "https://example.org", "depth": 2}`, 5)
	two := fakellm.Reply{Chunks: []fakellm.Chunk{
		{Tool: &fakellm.ToolFragment{Index: 0, ID: "c1", Name: "a"}},
		{Tool: &fakellm.ToolFragment{Index: 1, ID: "c2", Name: "b"}},
		{Tool: &fakellm.ToolFragment{Index: 1, Arguments: `{"y":`}},
		{Tool: &fakellm.ToolFragment{Index: 0, Arguments: `{"x": 1}`}},
		{Tool: &fakellm.ToolFragment{Index: 1, Arguments: ` 2}`}},
	}}
	bad := fakellm.ToolCall("c9", "broken", `{"url": `, 3)
	s := fakellm.New(fakellm.OpenAI, one, two, bad)
	defer s.Close()
	p := provider(s)

	chunks, resp, err := providertest.Collect(t, p, model.Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if len(chunks) < 9 || len(resp.ToolCalls) != 1 || resp.ToolCalls[0] != (model.ToolCall{ID: "call_a", Name: "crawl",
		Arguments: `{"url": "https://example.org", "depth": 2}`}) || resp.FinishReason != "tool_calls" {
		t.Fatalf("%d chunks, %+v", len(chunks), resp)
	}
	_, resp, err = providertest.Collect(t, p, model.Request{Model: "m"})
	if err != nil || len(resp.ToolCalls) != 2 || resp.ToolCalls[0].Arguments != `{"x": 1}` || resp.ToolCalls[1].Arguments != `{"y": 2}` ||
		resp.ToolCalls[1].Name != "b" {
		t.Fatalf("interleaved: %+v %v", resp, err)
	}
	_, resp, err = providertest.Collect(t, p, model.Request{Model: "m"})
	if err != nil || resp.ToolCalls[0].Arguments != `{"url": ` {
		t.Fatalf("invalid JSON arguments must be kept as sent: %+v %v", resp, err)
	}
}

// TestParallelCallsAtOneIndex: compatible servers that send every
// parallel call at index 0 (Gemini's), or in one delta without an index,
// or that repeat a call's name in each fragment, give each call its own
// name and arguments: they were merged into one call "echoecho" with the
// arguments of both.
func TestParallelCallsAtOneIndex(t *testing.T) {
	frag := func(id, name, args string) *fakellm.ToolFragment {
		return &fakellm.ToolFragment{ID: id, Name: name, Arguments: args}
	}
	atZero := fakellm.Reply{Chunks: []fakellm.Chunk{
		{Tool: frag("call_0", "echo", `{"city":"Paris"}`)},
		{Tool: frag("call_1", "echo", `{"city":"Rome"}`)},
	}}
	noIndex := fakellm.Reply{Chunks: []fakellm.Chunk{{Tool: &fakellm.ToolFragment{NoIndex: true, Name: "echo", Arguments: `{"city":"Paris"}`},
		Tools: []*fakellm.ToolFragment{{NoIndex: true, Name: "echo", Arguments: `{"city":"Rome"}`}}}}}
	nameRepeated := fakellm.Reply{Chunks: []fakellm.Chunk{
		{Tool: frag("call_0", "echo", `{"city":`)},
		{Tool: &fakellm.ToolFragment{Name: "echo", Arguments: `"Paris"}`}},
	}}
	s := fakellm.New(fakellm.OpenAI, atZero, noIndex, nameRepeated)
	defer s.Close()
	p := provider(s)
	two := []model.ToolCall{{ID: "call_0", Name: "echo", Arguments: `{"city":"Paris"}`}, {ID: "call_1", Name: "echo", Arguments: `{"city":"Rome"}`}}
	for _, want := range [][]model.ToolCall{two, {{Name: "echo", Arguments: `{"city":"Paris"}`}, {Name: "echo", Arguments: `{"city":"Rome"}`}},
		{{ID: "call_0", Name: "echo", Arguments: `{"city":"Paris"}`}}} {
		_, resp, err := providertest.Collect(t, p, model.Request{Model: "m"})
		if err != nil || !slices.Equal(resp.ToolCalls, want) {
			t.Errorf("tool calls %+v (%v), want %+v", resp.ToolCalls, err, want)
		}
	}
}

func TestRequestMapping(t *testing.T) {
	s := fakellm.New(fakellm.OpenAI, fakellm.Text("ok", 0))
	defer s.Close()
	p := openai.New(openai.Options{BaseURL: s.URL + "/proxy/v1/", APIKey: "sk-abc"})
	_, _, err := providertest.Collect(t, p, model.Request{
		Model: "gpt-4o-mini", System: "be brief",
		Messages: []model.Message{
			{Role: model.RoleUser, Content: "count"},
			{Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "c1", Name: "wc", Arguments: `{"text":"a b"}`}}},
			{Role: model.RoleTool, ToolCallID: "c1", ToolName: "wc", Content: "2"},
		},
		Tools: []model.ToolDef{{Name: "wc", Description: "counts", Parameters: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}}}`)},
			{Name: "noargs"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	r := s.Requests()[0]
	if r.Path != "/proxy/v1/chat/completions" || r.Authorization != "Bearer sk-abc" || r.Model != "gpt-4o-mini" || r.Body["stream"] != true {
		t.Fatalf("request %+v", r)
	}
	b, _ := json.Marshal(r.Body["messages"])
	var msgs []struct {
		Role       string `json:"role"`
		Content    string `json:"content"`
		ToolCallID string `json:"tool_call_id"`
		ToolCalls  []struct {
			ID       string `json:"id"`
			Type     string `json:"type"`
			Function struct{ Name, Arguments string }
		} `json:"tool_calls"`
	}
	if err := json.Unmarshal(b, &msgs); err != nil || len(msgs) != 4 {
		t.Fatalf("messages %s", b)
	}
	if msgs[0].Role != "system" || msgs[0].Content != "be brief" || msgs[1].Role != "user" ||
		msgs[2].Role != "assistant" || len(msgs[2].ToolCalls) != 1 || msgs[2].ToolCalls[0].ID != "c1" ||
		msgs[2].ToolCalls[0].Function.Arguments != `{"text":"a b"}` || msgs[2].ToolCalls[0].Type != "function" ||
		msgs[3].Role != "tool" || msgs[3].ToolCallID != "c1" || msgs[3].Content != "2" {
		t.Fatalf("messages %s", b)
	}
	tb, _ := json.Marshal(r.Body["tools"])
	if !strings.Contains(string(tb), `"name":"wc"`) || !strings.Contains(string(tb), `"name":"noargs"`) || !strings.Contains(string(tb), `"type":"object"`) {
		t.Errorf("tools %s", tb)
	}
}

// TestMaxCompletionTokens: every request asks for at most MaxTokens of
// reply (max_completion_tokens), DefaultMaxTokens when none is given, so
// that a model that never stops is stopped by its provider.
func TestMaxCompletionTokens(t *testing.T) {
	cases := []struct {
		name string
		set  int64
		want float64
	}{
		{name: "default", set: 0, want: openai.DefaultMaxTokens},
		{name: "model.max_tokens", set: 321, want: 321},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := fakellm.New(fakellm.OpenAI, fakellm.Text("ok", 0))
			defer s.Close()
			p := openai.New(openai.Options{BaseURL: s.BaseURL(), APIKey: "sk-abc", MaxTokens: tc.set})
			if _, _, err := providertest.Collect(t, p, model.Request{Model: "gpt-4o-mini"}); err != nil {
				t.Fatal(err)
			}
			b := s.Requests()[0].Body
			if b["max_completion_tokens"] != tc.want {
				t.Fatalf("max_completion_tokens %v, want %v (body %v)", b["max_completion_tokens"], tc.want, b)
			}
			if _, ok := b["max_tokens"]; ok {
				t.Errorf("max_tokens sent too (deprecated, and refused by reasoning models): %v", b)
			}
		})
	}
}

// TestChunksCountToolCallBytes: each chunk says how many bytes of tool-call
// names and arguments it carried, so that limits.max_reply counts them with
// the text.
func TestChunksCountToolCallBytes(t *testing.T) {
	s := fakellm.New(fakellm.OpenAI, fakellm.ToolCall("call_a", "crawl", `{"url": "https://example.org"}`, 4))
	defer s.Close()
	chunks, resp, err := providertest.Collect(t, provider(s), model.Request{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, c := range chunks {
		n += c.Size()
	}
	if n != resp.Size() || n != int64(len("crawl")+len(`{"url": "https://example.org"}`)) {
		t.Fatalf("chunks add up to %d bytes, the reply is %d", n, resp.Size())
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
		{"429 with Retry-After", fakellm.Reply{Status: 429, Message: "slow down", RetryAfter: "7"}, 429, false, false, 7 * time.Second, "slow down"},
		{"500", fakellm.Reply{Status: 500, Message: "boom"}, 500, false, false, 0, "boom"},
		{"400 is a refusal with the provider's reason", fakellm.Reply{Status: 400, Message: "context_length_exceeded"}, 400, true, false, 0, "context_length_exceeded"},
		{"401", fakellm.Reply{Status: 401, Message: "bad key"}, 401, true, false, 0, "bad key"},
		{"connection reset", fakellm.Reply{Reset: true}, 0, false, false, 0, ""},
		{"truncated stream", fakellm.Reply{Chunks: []fakellm.Chunk{{Text: "half"}}, Truncate: true}, 0, false, false, 0, "ended before the reply was complete"},
		{"malformed SSE JSON", fakellm.Reply{Chunks: []fakellm.Chunk{{Text: "a"}}, Malformed: true}, 0, false, true, 0, ""},
		{"a chunk that is a number", fakellm.Reply{Chunks: []fakellm.Chunk{{Text: "a"}}, BadData: "5"}, 0, false, true, 0, "a chunk is a JSON number"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := fakellm.New(fakellm.OpenAI, tc.reply)
			defer s.Close()
			_, _, err := providertest.Collect(t, provider(s), model.Request{Model: "m"})
			var me *model.Error
			if !errors.As(err, &me) {
				t.Fatalf("err %T %v", err, err)
			}
			if me.Status != tc.status || me.Rejected() != tc.rejected || me.Malformed != tc.malformed || me.RetryAfter != tc.retry ||
				!strings.Contains(me.Message, tc.msg) || model.Phase(err) != budget.PhaseLLMHTTP {
				t.Fatalf("got %+v", me)
			}
		})
	}
}

func TestWatchdogsOnARealStream(t *testing.T) {
	providertest.Watchdogs(t, fakellm.OpenAI, func(s *fakellm.Server) model.Provider { return provider(s) })
}

func TestCancelledContextEndsRecvPromptly(t *testing.T) {
	providertest.CancelEndsRecv(t, fakellm.OpenAI, func(s *fakellm.Server) model.Provider { return provider(s) })
}

func TestTextKeptLeavesTheTextToTheCaller(t *testing.T) {
	providertest.TextKept(t, fakellm.OpenAI, func(s *fakellm.Server) model.Provider { return provider(s) })
}

// A conversation longer than the model's context window is refused with
// code context_length_exceeded: a refusal marked TooLong, so the turn can
// compact instead of failing; other refusals are not.
func TestLengthRefusal(t *testing.T) {
	long := fakellm.New(fakellm.OpenAI, fakellm.Text("never", 0))
	defer long.Close()
	long.LimitContext(100)
	other := fakellm.New(fakellm.OpenAI, fakellm.Reply{Status: 400, Message: "Invalid schema for function 'wc'"})
	defer other.Close()
	req := model.Request{Model: "m", Messages: []model.Message{{Role: model.RoleUser, Content: strings.Repeat("word ", 200)}}}
	for _, tc := range []struct {
		s       *fakellm.Server
		tooLong bool
	}{{long, true}, {other, false}} {
		_, _, err := providertest.Collect(t, provider(tc.s), req)
		var me *model.Error
		if !errors.As(err, &me) || me.Status != 400 || !me.Rejected() || me.TooLong != tc.tooLong {
			t.Fatalf("err %v (%+v)", err, me)
		}
	}
}

func TestDocumentForAStream(t *testing.T) {
	providertest.DocumentForAStream(t, func(url string) model.Provider { return openai.New(openai.Options{BaseURL: url, APIKey: "sk-test"}) })
}
