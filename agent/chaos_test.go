package agent_test

// The chaos suite: the turn loop over the real providers (model/openai,
// model/anthropic) against fakellm servers on loopback that speak each
// provider's real SSE wire format and misbehave on cue. A chain of three
// endpoints — OpenAI model gpt-a with two credentials, then Anthropic model
// claude-b with one — and per scenario: which endpoint each request hit, in
// order; the phase of each failed attempt; the failover events; the stop
// reason, the flags and the message. Tool scenarios prove that a tool's
// time is never blamed on the model.
//
// These run on real time (sockets cannot live in a synctest bubble), with
// model budgets of 300ms and bounds that allow a loaded machine.

import (
	"context"
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/fakellm"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/anthropic"
	"github.com/timebox-run/timebox/model/openai"
	"github.com/timebox-run/timebox/tool"
)

// The credentials of the chain. Records name them by profile; the keys
// must never show in a record, an event or a message.
var chaosKeys = map[string]string{"sk-a-first": "A1", "sk-a-second": "A2", "sk-b-only": "B"}

// journal is the order in which the endpoints were hit, across servers.
type journal struct {
	mu   sync.Mutex
	hits []string
}

func (j *journal) add(label string) int {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.hits = append(j.hits, label)
	return len(j.hits) - 1
}

func (j *journal) list() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return slices.Clone(j.hits)
}

// script is what a server answers to its nth request (from 0); past the
// end it repeats its last reply.
type replies []fakellm.Reply

func (s replies) at(n int) fakellm.Reply {
	if len(s) == 0 {
		return fakellm.Text("ok", 0)
	}
	return s[min(n, len(s)-1)]
}

type chaos struct {
	t       *testing.T
	j       *journal
	a, b    *fakellm.Server
	reqs    map[string][]fakellm.Request
	mu      sync.Mutex
	budgets budget.Budgets
	limits  budget.Limits
	tools   []agent.Tool
	history []model.Message
	compact int
}

// newChaos starts the OpenAI server (gpt-a, credentials A1 and A2) and the
// Anthropic server (claude-b, credential B).
func newChaos(t *testing.T, a, b replies) *chaos {
	c := &chaos{t: t, j: &journal{}, reqs: map[string][]fakellm.Request{}}
	serve := func(format fakellm.Format, s replies) *fakellm.Server {
		return fakellm.NewFunc(format, func(n int, r fakellm.Request) fakellm.Reply {
			label := chaosKeys[strings.TrimPrefix(r.Authorization, "Bearer ")]
			c.j.add(label)
			c.mu.Lock()
			c.reqs[label] = append(c.reqs[label], r)
			c.mu.Unlock()
			return s.at(n)
		})
	}
	c.a, c.b = serve(fakellm.OpenAI, a), serve(fakellm.Anthropic, b)
	t.Cleanup(c.a.Close)
	t.Cleanup(c.b.Close)
	c.budgets = budget.Defaults()
	c.budgets.LLMFirstChunk = budget.Duration{D: 300 * time.Millisecond, Source: budget.SourceFile, Knob: budget.KeyLLMFirstChunk}
	c.budgets.LLMIdle = budget.Duration{D: 300 * time.Millisecond, Source: budget.SourceFile, Knob: budget.KeyLLMIdle}
	c.budgets.Turn = budget.Duration{D: 20 * time.Second, Source: budget.SourceFile, Knob: budget.KeyTurn}
	c.limits = budget.DefaultLimits()
	return c
}

func (c *chaos) endpoints() []model.Endpoint {
	oa := func(key string) model.Provider {
		return openai.New(openai.Options{BaseURL: c.a.BaseURL(), APIKey: key})
	}
	return []model.Endpoint{
		{Provider: oa("sk-a-first"), ProviderName: "openai", Model: "gpt-a", Profile: "A1"},
		{Provider: oa("sk-a-second"), ProviderName: "openai", Model: "gpt-a", Profile: "A2"},
		{Provider: anthropic.New(anthropic.Options{BaseURL: c.b.BaseURL(), APIKey: "sk-b-only"}), ProviderName: "anthropic", Model: "claude-b", Profile: "B"},
	}
}

type outcome struct {
	res      *agent.Result
	rec      *recorder
	hits     []string
	elapsed  time.Duration
	phases   []budget.Phase // of the failed model attempts, in order
	failover []*event.Failover
	agent    *agent.Agent
}

func (c *chaos) run(models ...model.Endpoint) outcome {
	c.t.Helper()
	if models == nil {
		models = c.endpoints()
	}
	a, err := agent.New(agent.Config{Name: "chaos", Instructions: "be brief", Models: models, Tools: c.tools,
		Budgets: c.budgets, Limits: c.limits, CompactAt: c.compact})
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(c.t.Context(), 30*time.Second)
	defer cancel()
	rec := &recorder{}
	start := time.Now()
	res := a.Run(ctx, agent.Input{SessionID: "chaos", History: c.history, Text: "go"}, rec)
	o := outcome{res: res, rec: rec, hits: c.j.list(), elapsed: time.Since(start), agent: a}
	checkEvents(c.t, res, rec)
	for _, m := range res.Record.ModelCalls {
		if m.Outcome != event.OutcomeOK {
			o.phases = append(o.phases, m.Phase)
		}
	}
	for _, e := range rec.ofType(event.TypeFailover) {
		o.failover = append(o.failover, e.Data.(*event.Failover))
	}
	// Nothing of a key, anywhere: the record (with its event log), the
	// conversation handed to the next turn, the closing message.
	b, _ := json.Marshal(res.Record)
	m, _ := json.Marshal(res.Messages)
	for key := range chaosKeys {
		if strings.Contains(string(b), key) || strings.Contains(string(m), key) {
			c.t.Fatalf("key %s is in the record or the messages", key)
		}
	}
	// Each endpoint was asked for its own model.
	for label, rs := range c.requests() {
		for _, r := range rs {
			if want := chaosModels[label]; r.Model != want {
				c.t.Fatalf("%s was asked for model %q, want %q", label, r.Model, want)
			}
		}
	}
	return o
}

// chaosModels is the model each credential's endpoint asks for, and
// chaosLabels how failover events name each endpoint.
var (
	chaosModels = map[string]string{"A1": "gpt-a", "A2": "gpt-a", "B": "claude-b"}
	chaosLabels = map[string]string{"A1": "openai:gpt-a (A1)", "A2": "openai:gpt-a (A2)", "B": "anthropic:claude-b (B)"}
)

func (c *chaos) requests() map[string][]fakellm.Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string][]fakellm.Request{}
	for k, v := range c.reqs {
		out[k] = slices.Clone(v)
	}
	return out
}

func stallFirst() fakellm.Reply {
	return fakellm.Reply{Stall: true, StallAfter: 0, Chunks: []fakellm.Chunk{{Text: "never"}}}
}

func stallMid() fakellm.Reply {
	return fakellm.Reply{Stall: true, StallAfter: 2, Chunks: []fakellm.Chunk{{Text: "Let "}, {Text: "me "}, {Text: "see"}}}
}

func answer(text string) fakellm.Reply { return fakellm.Text(text, 0) }

func TestChaos(t *testing.T) {
	http := budget.PhaseLLMHTTP
	cases := []struct {
		name   string
		a, b   replies
		hits   []string
		reason budget.StopReason
		answer string
		phases []budget.Phase
		// msg must be in the closing message; notMsg must not.
		msg, notMsg []string
	}{
		{name: "stall before the first chunk: next credential",
			a: replies{stallFirst(), answer("from A2")}, hits: []string{"A1", "A2"}, reason: budget.Answered, answer: "from A2",
			phases: []budget.Phase{budget.PhaseLLMFirstChunk}},
		{name: "stall mid-stream on both credentials: fallback model over Anthropic",
			a: replies{stallMid()}, b: replies{answer("from claude")}, hits: []string{"A1", "A2", "B"}, reason: budget.Answered, answer: "from claude",
			phases: []budget.Phase{budget.PhaseLLMIdle, budget.PhaseLLMIdle}},
		{name: "500: next credential",
			a: replies{{Status: 500, Message: "boom"}, answer("from A2")}, hits: []string{"A1", "A2"}, reason: budget.Answered, answer: "from A2",
			phases: []budget.Phase{http}},
		{name: "503 then 429 then Anthropic 529: every endpoint failed",
			a: replies{{Status: 503, Message: "unavailable"}, {Status: 429, Message: "quota"}}, b: replies{{Status: 529, Message: "Overloaded"}},
			hits: []string{"A1", "A2", "B"}, reason: budget.ModelUnavailable, phases: []budget.Phase{http, http, http},
			msg: []string{"1) openai:gpt-a with A1: HTTP 503: unavailable", "2) openai:gpt-a with A2: HTTP 429: quota",
				"3) anthropic:claude-b with B: HTTP 529: overloaded_error: Overloaded"}},
		{name: "connection reset: next credential",
			a: replies{{Reset: true}, answer("from A2")}, hits: []string{"A1", "A2"}, reason: budget.Answered, answer: "from A2",
			phases: []budget.Phase{http}},
		{name: "malformed SSE: next credential",
			a: replies{{Chunks: []fakellm.Chunk{{Text: "a"}}, Malformed: true}, answer("from A2")}, hits: []string{"A1", "A2"}, reason: budget.Answered,
			answer: "from A2", phases: []budget.Phase{http}},
		{name: "stream cut before it finished: next credential",
			a: replies{{Chunks: []fakellm.Chunk{{Text: "half"}}, Truncate: true}, answer("from A2")}, hits: []string{"A1", "A2"},
			reason: budget.Answered, answer: "from A2", phases: []budget.Phase{http}},
		{name: "400 is a refusal: no rotation, the provider's reason",
			a: replies{{Status: 400, Message: "context_length_exceeded"}}, hits: []string{"A1"}, reason: budget.ModelRejected,
			phases: []budget.Phase{http}, msg: []string{"context_length_exceeded", "HTTP 400"}},
		{name: "401 refuses the credential: the model's next credential",
			a: replies{{Status: 401, Message: "Incorrect API key provided"}, answer("from A2")}, hits: []string{"A1", "A2"}, reason: budget.Answered,
			answer: "from A2", phases: []budget.Phase{http}},
		{name: "401 on each credential of the model: a refusal, no fallback model",
			a: replies{{Status: 401, Message: "Incorrect API key provided"}}, hits: []string{"A1", "A2"}, reason: budget.ModelRejected,
			phases: []budget.Phase{http, http}, msg: []string{"Incorrect API key provided", "HTTP 401",
				"each credential of openai:gpt-a was refused: A1, A2, and no other model was tried"}, notMsg: []string{"not retried"}},
		{name: "stall before even the headers: next credential",
			a: replies{{StallBeforeHeaders: true}, answer("from A2")}, hits: []string{"A1", "A2"}, reason: budget.Answered, answer: "from A2",
			phases: []budget.Phase{budget.PhaseLLMFirstChunk}},
		{name: "stall mid-stream on the first credential only: its partial text is not the answer",
			a: replies{stallMid(), answer("from A2")}, hits: []string{"A1", "A2"}, reason: budget.Answered, answer: "from A2",
			phases: []budget.Phase{budget.PhaseLLMIdle}},
		{name: "408: next credential",
			a: replies{{Status: 408, Message: "request timeout"}, answer("from A2")}, hits: []string{"A1", "A2"}, reason: budget.Answered, answer: "from A2",
			phases: []budget.Phase{http}},
		{name: "429 without Retry-After: next credential at once",
			a: replies{{Status: 429, Message: "rate limited"}, answer("from A2")}, hits: []string{"A1", "A2"}, reason: budget.Answered, answer: "from A2",
			phases: []budget.Phase{http}},
		{name: "403 on each credential: a refusal",
			a: replies{{Status: 403, Message: "model not enabled for this project"}}, hits: []string{"A1", "A2"}, reason: budget.ModelRejected,
			phases: []budget.Phase{http, http}, msg: []string{"HTTP 403", "model not enabled for this project", "not a timeout", "A1, A2"}},
		{name: "a credential refused, the next one fails: on along the chain",
			a: replies{{Status: 401, Message: "key revoked"}, {Status: 503, Message: "unavailable"}}, hits: []string{"A1", "A2", "B"},
			reason: budget.Answered, answer: "ok", phases: []budget.Phase{http, http}},
		{name: "404 is a refusal",
			a: replies{{Status: 404, Message: "The model `gpt-a` does not exist"}}, hits: []string{"A1"}, reason: budget.ModelRejected,
			phases: []budget.Phase{http}, msg: []string{"HTTP 404", "does not exist"}},
		{name: "413 is a refusal",
			a: replies{{Status: 413, Message: "request too large"}}, hits: []string{"A1"}, reason: budget.ModelRejected,
			phases: []budget.Phase{http}, msg: []string{"HTTP 413", "request too large"}},
		{name: "422 is a refusal",
			a: replies{{Status: 422, Message: "invalid tool schema"}}, hits: []string{"A1"}, reason: budget.ModelRejected,
			phases: []budget.Phase{http}, msg: []string{"HTTP 422", "invalid tool schema"}},
		{name: "the fallback refuses after the primary failed: model_rejected, the failovers before it kept",
			a: replies{{Status: 500, Message: "boom"}}, b: replies{{Status: 401, Message: "invalid x-api-key"}},
			hits: []string{"A1", "A2", "B"}, reason: budget.ModelRejected, phases: []budget.Phase{http, http, http},
			msg: []string{"anthropic rejected the request (HTTP 401)", "invalid x-api-key"}},
		{name: "Anthropic malformed and OpenAI reset: every endpoint failed",
			a: replies{{Reset: true}}, b: replies{{Chunks: []fakellm.Chunk{{Text: "a"}}, Malformed: true}},
			hits: []string{"A1", "A2", "B"}, reason: budget.ModelUnavailable, phases: []budget.Phase{http, http, http},
			msg: []string{"1) openai:gpt-a with A1:", "2) openai:gpt-a with A2:", "3) anthropic:claude-b with B: malformed stream:", "(llm_http)"}},
		{name: "Anthropic stream cut short after the primary failed",
			a: replies{{Status: 502, Message: "bad gateway"}}, b: replies{{Chunks: []fakellm.Chunk{{Text: "half"}}, Truncate: true}},
			hits: []string{"A1", "A2", "B"}, reason: budget.ModelUnavailable, phases: []budget.Phase{http, http, http},
			msg: []string{"HTTP 502: bad gateway (llm_http)"}, notMsg: []string{"timed out", "llm_idle", "llm_first_chunk"}},
		{name: "Anthropic overloaded mid-stream after a stalled primary",
			a: replies{stallFirst()}, b: replies{{Chunks: []fakellm.Chunk{{Text: "a"}}, ErrorEvent: `{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}`}},
			hits: []string{"A1", "A2", "B"}, reason: budget.ModelUnavailable,
			phases: []budget.Phase{budget.PhaseLLMFirstChunk, budget.PhaseLLMFirstChunk, http},
			msg:    []string{"no reply within 300ms (llm_first_chunk; raise timeouts.llm_first_chunk)", "HTTP 529: overloaded_error: Overloaded"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newChaos(t, tc.a, tc.b)
			o := c.run()
			r := o.res.Record
			if !slices.Equal(o.hits, tc.hits) {
				t.Fatalf("hits %v, want %v", o.hits, tc.hits)
			}
			// (A stopped turn keeps what it produced, so its answer is
			// only checked when it answered.)
			if r.StopReason != tc.reason || (tc.reason == budget.Answered && r.Answer != tc.answer) {
				t.Fatalf("stopped %s with %q: %s", r.StopReason, r.Answer, r.Message)
			}
			if !slices.Equal(o.phases, tc.phases) {
				t.Fatalf("failed attempts in phases %v, want %v", o.phases, tc.phases)
			}
			// A failover event for each failed attempt that had somewhere to
			// go (not after a refusal, nor after the last endpoint).
			wantFailovers := len(tc.phases)
			if tc.reason == budget.ModelRejected || tc.reason == budget.ModelUnavailable {
				wantFailovers = len(tc.hits) - 1
			}
			if len(o.failover) != wantFailovers || r.Failovers != wantFailovers {
				t.Fatalf("%d failover events, record %d, want %d", len(o.failover), r.Failovers, wantFailovers)
			}
			for i, f := range o.failover {
				if f.Phase != tc.phases[i] || f.Attempt != i+2 || f.Step != 1 ||
					f.From != chaosLabels[tc.hits[i]] || f.To != chaosLabels[tc.hits[i+1]] || f.Reason != r.ModelCalls[i].Error {
					t.Fatalf("failover %d: %+v", i, f)
				}
			}
			for i, m := range r.ModelCalls {
				want := event.OutcomeOK
				switch {
				case i < len(tc.phases) && tc.phases[i] == http:
					want = event.OutcomeError
				case i < len(tc.phases):
					want = event.OutcomeTimedOut
				}
				if m.Attempt != i+1 || m.Profile != tc.hits[i] || m.Model != chaosModels[tc.hits[i]] || m.Outcome != want || m.Step != 1 {
					t.Fatalf("model call %d: %+v", i, m)
				}
			}
			for _, s := range tc.msg {
				if !strings.Contains(r.Message, s) {
					t.Fatalf("message %q lacks %q", r.Message, s)
				}
			}
			for _, s := range tc.notMsg {
				if strings.Contains(r.Message, s) {
					t.Fatalf("message %q says %q", r.Message, s)
				}
			}
			if r.Flags != (event.Flags{}) {
				t.Fatalf("flags %+v", r.Flags)
			}
		})
	}
}

// A 429 whose Retry-After fits the turn: the chain is tried on, and when
// it is spent the rate-limited endpoint is asked again once its wait is
// over — within the turn, not by burning requests.
func TestChaosRetryAfterWithinTheTurn(t *testing.T) {
	c := newChaos(t, replies{{Status: 429, Message: "slow down", RetryAfter: "1"}, {Status: 503, Message: "down"}, answer("after the wait")},
		replies{{Status: 503, Message: "down"}})
	o := c.run()
	r := o.res.Record
	if r.StopReason != budget.Answered || r.Answer != "after the wait" {
		t.Fatalf("got %s: %s", r.StopReason, r.Message)
	}
	if want := []string{"A1", "A2", "B", "A1"}; !slices.Equal(o.hits, want) {
		t.Fatalf("hits %v, want %v", o.hits, want)
	}
	if o.elapsed < 900*time.Millisecond || o.elapsed > 10*time.Second {
		t.Fatalf("answered after %s; the Retry-After was 1s", o.elapsed)
	}
	if len(o.failover) != 3 || !strings.Contains(o.failover[2].Reason, "Retry-After") {
		t.Fatalf("failovers %+v", o.failover)
	}
}

// A provider that never answers: limits.idle_breaker attempts, not more.
func TestChaosIdleBreaker(t *testing.T) {
	c := newChaos(t, replies{stallMid()}, replies{stallMid()})
	c.limits.IdleBreaker = budget.Count{N: 2, Source: budget.SourceFile, Knob: budget.KeyIdleBreaker}
	o := c.run()
	r := o.res.Record
	if r.StopReason != budget.ModelUnresponsive || !slices.Equal(o.hits, []string{"A1", "A2"}) {
		t.Fatalf("stopped %s after %v: %s", r.StopReason, o.hits, r.Message)
	}
	if !strings.Contains(r.Message, "limits.idle_breaker") {
		t.Fatalf("message %q", r.Message)
	}
	// With the default of 3, three endpoints: the third silence stops it.
	c = newChaos(t, replies{stallMid()}, replies{stallMid()})
	o = c.run(append(c.endpoints(), c.endpoints()...)...)
	if o.res.Record.StopReason != budget.ModelUnresponsive || len(o.hits) != 3 {
		t.Fatalf("stopped %s after %v", o.res.Record.StopReason, o.hits)
	}
}

// hang is a Go tool that runs until its context ends.
func hang(name string, timeout time.Duration) agent.Tool {
	return goTool(name, budget.Cooperative, timeout, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
		<-ctx.Done()
		return nil, context.Cause(ctx)
	})
}

// The incident this project exists for: a tool hangs until the turn's
// ceiling fires. That is the tool's time, not the model's: no rotation, no
// fallback, no extra request, and a message about the tool.
func TestChaosToolHangsUntilTheTurnCeiling(t *testing.T) {
	c := newChaos(t, replies{fakellm.ToolCall("call_1", "web_fetch", `{"url": "https://unreachable.example"}`, 8), answer("never")},
		replies{answer("the fallback must not be asked")})
	c.tools = []agent.Tool{hang("web_fetch", 10*time.Minute)}
	c.budgets.Turn = budget.Duration{D: time.Second, Source: budget.SourceFile, Knob: budget.KeyTurn}
	o := c.run()
	r := o.res.Record
	if r.StopReason != budget.TurnTimeout || !r.Flags.TimedOutDuringToolExecution || !r.Flags.TimedOutByTurnBudget || r.Flags.TimedOutDuringCompaction {
		t.Fatalf("stopped %s with flags %+v", r.StopReason, r.Flags)
	}
	// The servers' own logs agree: one request, to A1; none after the stop.
	if len(o.failover) != 0 || r.Failovers != 0 || !slices.Equal(o.hits, []string{"A1"}) ||
		len(c.a.Requests()) != 1 || len(c.b.Requests()) != 0 || len(r.ModelCalls) != 1 {
		t.Fatalf("%d failovers, hits %v", len(o.failover), o.hits)
	}
	if !strings.Contains(r.Message, "tool web_fetch") || !strings.Contains(r.Message, "timeouts.turn") ||
		strings.Contains(strings.ToLower(r.Message), "model") {
		t.Fatalf("message %q", r.Message)
	}
	if tr := toolRecord(t, o.res, "web_fetch"); tr.Phase != budget.PhaseTurn {
		t.Fatalf("tool record %+v", tr)
	}
	if o.elapsed > 5*time.Second {
		t.Fatalf("the 1s turn took %s", o.elapsed)
	}
}

// A tool timing out is the tool's phase: the model is told, on the same
// endpoint, and answers; nothing rotates.
func TestChaosToolTimeoutIsNotAModelFailure(t *testing.T) {
	c := newChaos(t, replies{fakellm.ToolCall("call_1", "web_fetch", `{"url": "x"}`, 4), answer("it timed out, so here is what I know")}, nil)
	c.tools = []agent.Tool{hang("web_fetch", 200*time.Millisecond)}
	o := c.run()
	r := o.res.Record
	if r.StopReason != budget.Answered || len(o.failover) != 0 || !slices.Equal(o.hits, []string{"A1", "A1"}) {
		t.Fatalf("stopped %s, %d failovers, hits %v", r.StopReason, len(o.failover), o.hits)
	}
	tr := toolRecord(t, o.res, "web_fetch")
	if tr.Outcome != event.OutcomeTimedOut || tr.Phase != budget.PhaseTool {
		t.Fatalf("tool record %+v", tr)
	}
	// The model got the tool_timeout result in its next request.
	b, _ := json.Marshal(c.reqs["A1"][1].Body["messages"])
	if !strings.Contains(string(b), "tool_timeout") {
		t.Fatalf("second request's messages: %s", b)
	}
}

// Tool-call arguments cut off mid-JSON: the model is told its arguments
// were not JSON and the turn goes on, on the same endpoint — over both wire
// formats.
func TestChaosTruncatedToolCallJSON(t *testing.T) {
	cut := fakellm.ToolCall("call_1", "web_fetch", `{"url": "https://exa`, 5)
	for _, first := range []string{"A1", "B"} {
		t.Run(first, func(t *testing.T) {
			c := newChaos(t, replies{cut, answer("retried properly")}, replies{cut, answer("retried properly")})
			ran := false
			c.tools = []agent.Tool{goTool("web_fetch", budget.Cooperative, time.Minute, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
				ran = true
				return "page", nil
			})}
			models := c.endpoints()
			if first == "B" {
				models = models[2:]
			}
			o := c.run(models...)
			r := o.res.Record
			if r.StopReason != budget.Answered || len(o.failover) != 0 || !slices.Equal(o.hits, []string{first, first}) || ran {
				t.Fatalf("stopped %s, %d failovers, hits %v, tool ran %v", r.StopReason, len(o.failover), o.hits, ran)
			}
			b, _ := json.Marshal(c.reqs[first][1].Body["messages"])
			if !strings.Contains(string(b), "JSON") {
				t.Fatalf("the model was not told: %s", b)
			}
		})
	}
}

// A compaction call that times out: never rotated, never a fallback; the
// turn goes on uncompacted, flagged.
func TestChaosCompactionTimeoutDoesNotRotate(t *testing.T) {
	c := newChaos(t, replies{stallFirst(), answer("answered with the full history")}, replies{answer("the fallback must not be asked")})
	c.compact, c.history = 500, longHistory()
	c.budgets.Compaction = budget.Duration{D: 300 * time.Millisecond, Source: budget.SourceFile, Knob: budget.KeyCompaction}
	c.budgets.LLMFirstChunk.D = 5 * time.Second // the compaction budget fires first
	o := c.run()
	r := o.res.Record
	if r.StopReason != budget.Answered || !r.Flags.TimedOutDuringCompaction || len(o.failover) != 0 || !slices.Equal(o.hits, []string{"A1", "A1"}) {
		t.Fatalf("stopped %s, flags %+v, %d failovers, hits %v", r.StopReason, r.Flags, len(o.failover), o.hits)
	}
	f := o.rec.ofType(event.TypeCompactionFinished)[0].Data.(*event.CompactionFinished)
	if f.Outcome != event.OutcomeTimedOut || f.Phase != budget.PhaseCompaction {
		t.Fatalf("compaction_finished %+v", f)
	}
}

// A cancelled turn is the user's doing: no rotation, stop reason cancelled.
func TestChaosCancelIsNotAModelFailure(t *testing.T) {
	c := newChaos(t, replies{stallMid()}, nil)
	c.budgets.LLMIdle.D = 10 * time.Second
	a, err := agent.New(agent.Config{Models: c.endpoints(), Budgets: c.budgets, Limits: c.limits})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(t.Context())
	time.AfterFunc(200*time.Millisecond, func() { cancel(&budget.CancelError{Reason: budget.Cancelled, By: "the user"}) })
	rec := &recorder{}
	res := a.Run(ctx, agent.Input{Text: "go"}, rec)
	r := res.Record
	if r.StopReason != budget.Cancelled || len(rec.ofType(event.TypeFailover)) != 0 || len(c.j.list()) != 1 {
		t.Fatalf("stopped %s, hits %v: %s", r.StopReason, c.j.list(), r.Message)
	}
}

// A Retry-After is waited out only when every link has failed and the wait
// ends inside the turn and inside the step window; otherwise the chain moves
// on at once and, spent, the turn fails model_unavailable without waiting.
func TestChaosRetryAfterNotWaited(t *testing.T) {
	cases := []struct {
		name   string
		a, b   replies
		step   time.Duration
		hits   []string
		reason budget.StopReason
	}{
		{name: "beyond the turn's remaining time",
			a: replies{{Status: 429, Message: "slow down", RetryAfter: "3600"}, {Status: 503, Message: "down"}}, b: replies{{Status: 503, Message: "down"}},
			hits: []string{"A1", "A2", "B"}, reason: budget.ModelUnavailable},
		{name: "beyond the step window",
			a: replies{{Status: 429, Message: "slow down", RetryAfter: "3"}, {Status: 503, Message: "down"}}, b: replies{{Status: 503, Message: "down"}},
			step: 2 * time.Second, hits: []string{"A1", "A2", "B"}, reason: budget.ModelUnavailable},
		{name: "another credential answers: no wait at all",
			a:    replies{{Status: 429, Message: "slow down", RetryAfter: "30"}, answer("from A2")},
			hits: []string{"A1", "A2"}, reason: budget.Answered},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newChaos(t, tc.a, tc.b)
			if tc.step > 0 {
				c.budgets.Step = budget.Duration{D: tc.step, Source: budget.SourceFile, Knob: budget.KeyStep}
			}
			o := c.run()
			r := o.res.Record
			if r.StopReason != tc.reason || !slices.Equal(o.hits, tc.hits) {
				t.Fatalf("stopped %s after %v: %s", r.StopReason, o.hits, r.Message)
			}
			if o.elapsed > 900*time.Millisecond {
				t.Fatalf("took %s: a Retry-After was waited out", o.elapsed)
			}
			if len(o.failover) != len(tc.hits)-1 {
				t.Fatalf("failovers %+v", o.failover)
			}
			for _, f := range o.failover {
				if strings.Contains(f.Reason, "retrying") {
					t.Fatalf("failover %+v", f)
				}
			}
			// It says the wait the provider asked for, which the turn
			// could not give it.
			if tc.reason == budget.ModelUnavailable && !strings.Contains(r.Message, "1) openai:gpt-a with A1: HTTP 429: slow down; it asked to be tried again after ") {
				t.Fatalf("message %q", r.Message)
			}
		})
	}
}

// The idle breaker counts silences in a row: a completed reply in between
// starts the count again.
func TestChaosIdleBreakerResetsOnAReply(t *testing.T) {
	c := newChaos(t, replies{stallFirst(), fakellm.ToolCall("call_1", "lookup", `{}`, 8), stallFirst(), stallMid()}, nil)
	c.limits.IdleBreaker = budget.Count{N: 2, Source: budget.SourceFile, Knob: budget.KeyIdleBreaker}
	c.tools = []agent.Tool{goTool("lookup", budget.Cooperative, time.Minute, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
		return "found", nil
	})}
	o := c.run()
	r := o.res.Record
	// Step 1: A1 silent (1), A2 asks for a tool (0). Step 2: A1 silent (1),
	// A2 silent mid-reply (2): stop, before the fallback is asked.
	if r.StopReason != budget.ModelUnresponsive || !slices.Equal(o.hits, []string{"A1", "A2", "A1", "A2"}) {
		t.Fatalf("stopped %s after %v: %s", r.StopReason, o.hits, r.Message)
	}
	want := []budget.Phase{budget.PhaseLLMFirstChunk, budget.PhaseLLMFirstChunk, budget.PhaseLLMIdle}
	if !slices.Equal(o.phases, want) || len(o.failover) != 2 || o.failover[1].Step != 2 {
		t.Fatalf("phases %v, failovers %+v", o.phases, o.failover)
	}
	if !strings.Contains(r.Message, "went silent 2 times in a row (limits.idle_breaker)") ||
		!strings.Contains(r.Message, "2) openai:gpt-a with A2: went silent for 300ms mid-reply (llm_idle; raise timeouts.llm_idle)") {
		t.Fatalf("message %q", r.Message)
	}
}

// The step watchdog firing while a tool runs past its own timeout is the
// tool's time: no rotation, no new request, a message about the tool. A
// cooperative tool that ignores its cancellation is still running in its
// kill grace when step fires.
func TestChaosStepWatchdogDuringTool(t *testing.T) {
	c := newChaos(t, replies{fakellm.ToolCall("call_1", "drift", `{}`, 8), answer("never")}, replies{answer("the fallback must not be asked")})
	returned := make(chan struct{})
	c.tools = []agent.Tool{goTool("drift", budget.Cooperative, 50*time.Millisecond, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
		defer close(returned)
		<-ctx.Done()
		time.Sleep(1500 * time.Millisecond) // ignores its cancellation past its 1s kill grace
		return nil, context.Cause(ctx)
	})}
	c.budgets.Step = budget.Duration{D: 400 * time.Millisecond, Source: budget.SourceFile, Knob: budget.KeyStep}
	o := c.run()
	r := o.res.Record
	if r.StopReason != budget.NoProgress || !r.Flags.TimedOutDuringToolExecution || r.Flags.TimedOutByTurnBudget || r.Flags.TimedOutDuringCompaction {
		t.Fatalf("stopped %s with flags %+v: %s", r.StopReason, r.Flags, r.Message)
	}
	if len(o.failover) != 0 || r.Failovers != 0 || !slices.Equal(o.hits, []string{"A1"}) || len(c.b.Requests()) != 0 {
		t.Fatalf("%d failovers, hits %v", len(o.failover), o.hits)
	}
	if !strings.Contains(r.Message, "nothing progressed for 400ms (timeouts.step)") || !strings.Contains(r.Message, "tool drift") ||
		strings.Contains(strings.ToLower(r.Message), "model") {
		t.Fatalf("message %q", r.Message)
	}
	if tr := toolRecord(t, o.res, "drift"); tr.Phase != budget.PhaseTool || tr.Outcome != event.OutcomeAbandoned {
		t.Fatalf("tool record %+v", tr)
	}
	// The abandoned call returns on its own, 1.5s after its cancellation:
	// the test waits for it, so that run alone it leaves no goroutine.
	wait.For(t, 5*time.Second, "the abandoned call to return", func() bool {
		select {
		case <-returned:
			return true
		default:
			return false
		}
	})
}

// An advisory tool that runs silently past its own timeout and past
// timeouts.step is waited for (spec §6): its result is used, the model
// answers, and nothing rotates.
func TestChaosAdvisoryToolOutlastsStep(t *testing.T) {
	c := newChaos(t, replies{fakellm.ToolCall("call_1", "report", `{}`, 8), answer("done")}, replies{answer("the fallback must not be asked")})
	c.tools = []agent.Tool{goTool("report", budget.Advisory, 50*time.Millisecond, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
		select {
		case <-time.After(700 * time.Millisecond):
			return "the report", nil
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	})}
	c.budgets.Step = budget.Duration{D: 400 * time.Millisecond, Source: budget.SourceFile, Knob: budget.KeyStep}
	o := c.run()
	r := o.res.Record
	if r.StopReason != budget.Answered || r.Answer != "done" || r.Flags != (event.Flags{}) {
		t.Fatalf("stopped %s with flags %+v: %s", r.StopReason, r.Flags, r.Message)
	}
	if len(o.failover) != 0 || !slices.Equal(o.hits, []string{"A1", "A1"}) || len(c.b.Requests()) != 0 {
		t.Fatalf("%d failovers, hits %v", len(o.failover), o.hits)
	}
	if tr := toolRecord(t, o.res, "report"); tr.Outcome != event.OutcomeOK || !tr.Overran {
		t.Fatalf("tool record %+v", tr)
	}
}

// Turn-level budgets that fire while a model call is waiting are not model
// failures either: no rotation, and the flags say which budget fired.
func TestChaosTurnBudgetsDuringAModelCall(t *testing.T) {
	t.Run("the turn ceiling while the model is silent", func(t *testing.T) {
		c := newChaos(t, replies{stallFirst()}, replies{answer("the fallback must not be asked")})
		c.budgets.LLMFirstChunk.D = 10 * time.Second
		c.budgets.Turn = budget.Duration{D: 500 * time.Millisecond, Source: budget.SourceFile, Knob: budget.KeyTurn}
		o := c.run()
		r := o.res.Record
		if r.StopReason != budget.TurnTimeout || r.Flags != (event.Flags{TimedOutByTurnBudget: true}) {
			t.Fatalf("stopped %s with flags %+v: %s", r.StopReason, r.Flags, r.Message)
		}
		if len(o.failover) != 0 || !slices.Equal(o.hits, []string{"A1"}) || len(r.ModelCalls) != 1 || r.ModelCalls[0].Phase != budget.PhaseTurn {
			t.Fatalf("%d failovers, hits %v, model calls %+v", len(o.failover), o.hits, r.ModelCalls)
		}
		if !strings.Contains(r.Message, "the limit for one turn (timeouts.turn)") || !strings.Contains(r.Message, "model gpt-a, waiting for its reply") ||
			strings.Contains(r.Message, "llm_first_chunk") {
			t.Fatalf("message %q", r.Message)
		}
		sameStopOf(t, o, c.budgets)
	})
	t.Run("llm_budget spent on a slow stream", func(t *testing.T) {
		c := newChaos(t, replies{stallMid()}, replies{answer("the fallback must not be asked")})
		c.budgets.LLMIdle.D = 10 * time.Second
		c.budgets.LLMBudget = budget.Duration{D: 400 * time.Millisecond, Source: budget.SourceFile, Knob: budget.KeyLLMBudget}
		o := c.run()
		r := o.res.Record
		if r.StopReason != budget.LLMBudgetExhausted || r.Flags != (event.Flags{}) || r.Answer != "Let me " {
			t.Fatalf("stopped %s with flags %+v and answer %q: %s", r.StopReason, r.Flags, r.Answer, r.Message)
		}
		if len(o.failover) != 0 || !slices.Equal(o.hits, []string{"A1"}) || !slices.Equal(o.phases, []budget.Phase{budget.PhaseLLMBudget}) {
			t.Fatalf("%d failovers, hits %v, phases %v", len(o.failover), o.hits, o.phases)
		}
		if !strings.Contains(r.Message, "its budget (timeouts.llm_budget)") {
			t.Fatalf("message %q", r.Message)
		}
	})
}

// A tool silent past its idle_timeout: phase tool_idle, no rotation; the
// model, on the same endpoint, is told and answers.
func TestChaosToolIdleTimeoutIsNotAModelFailure(t *testing.T) {
	c := newChaos(t, replies{fakellm.ToolCall("call_1", "crawl", `{}`, 8), answer("the crawl went quiet")}, nil)
	crawl := hang("crawl", time.Minute)
	crawl.Tool = tool.NewFunc("crawl", "test tool", nil, func(ctx context.Context, _ json.RawMessage, p tool.Progress) (any, error) {
		p.Report(tool.Report{Message: "page 1"})
		<-ctx.Done()
		return nil, context.Cause(ctx)
	})
	crawl.Budget.IdleTimeout = budget.Duration{D: 150 * time.Millisecond, Source: budget.SourceTool, Knob: "tools[crawl].idle_timeout in agent.yaml"}
	c.tools = []agent.Tool{crawl}
	o := c.run()
	r := o.res.Record
	if r.StopReason != budget.Answered || r.Answer != "the crawl went quiet" || len(o.failover) != 0 || !slices.Equal(o.hits, []string{"A1", "A1"}) {
		t.Fatalf("stopped %s, %d failovers, hits %v", r.StopReason, len(o.failover), o.hits)
	}
	if tr := toolRecord(t, o.res, "crawl"); tr.Outcome != event.OutcomeTimedOut || tr.Phase != budget.PhaseToolIdle || tr.ProgressCount != 1 {
		t.Fatalf("tool record %+v", tr)
	}
	b, _ := json.Marshal(c.requests()["A1"][1].Body["messages"])
	if !strings.Contains(string(b), "tool_timeout") || !strings.Contains(string(b), "tool_idle") {
		t.Fatalf("second request's messages: %s", b)
	}
}

// Compaction and the turn's budgets over the real wire format.
func TestChaosCompaction(t *testing.T) {
	t.Run("the turn ceiling fires during compaction", func(t *testing.T) {
		c := newChaos(t, replies{stallFirst()}, replies{answer("the fallback must not be asked")})
		c.compact, c.history = 500, longHistory()
		c.budgets.LLMFirstChunk.D = 10 * time.Second
		c.budgets.Turn = budget.Duration{D: 500 * time.Millisecond, Source: budget.SourceFile, Knob: budget.KeyTurn}
		o := c.run()
		r := o.res.Record
		if r.StopReason != budget.TurnTimeout || r.Flags != (event.Flags{TimedOutByTurnBudget: true, TimedOutDuringCompaction: true}) {
			t.Fatalf("stopped %s with flags %+v: %s", r.StopReason, r.Flags, r.Message)
		}
		if len(o.failover) != 0 || !slices.Equal(o.hits, []string{"A1"}) || len(r.ModelCalls) != 1 || !r.ModelCalls[0].Compaction {
			t.Fatalf("%d failovers, hits %v, model calls %+v", len(o.failover), o.hits, r.ModelCalls)
		}
		if !strings.Contains(r.Message, "Last step: compaction (model gpt-a)") || !strings.Contains(r.Message, "(timeouts.turn)") ||
			strings.Contains(r.Message, "llm_") || strings.Contains(r.Message, "timeouts.compaction") {
			t.Fatalf("message %q", r.Message)
		}
		sameStopOf(t, o, c.budgets)
	})
	t.Run("compaction times out and the full history is refused", func(t *testing.T) {
		c := newChaos(t, replies{stallFirst(), {Status: 400, Message: "context_length_exceeded"}}, replies{answer("the fallback must not be asked")})
		c.compact, c.history = 500, longHistory()
		c.budgets.Compaction = budget.Duration{D: 300 * time.Millisecond, Source: budget.SourceFile, Knob: budget.KeyCompaction}
		c.budgets.LLMFirstChunk.D = 10 * time.Second
		o := c.run()
		r := o.res.Record
		// A length refusal after the compaction timed out: the history
		// cannot fit (spec §6), compaction_failed, no second compaction.
		if r.StopReason != budget.CompactionFailed || r.Flags != (event.Flags{TimedOutDuringCompaction: true}) {
			t.Fatalf("stopped %s with flags %+v: %s", r.StopReason, r.Flags, r.Message)
		}
		if len(o.failover) != 0 || !slices.Equal(o.hits, []string{"A1", "A1"}) {
			t.Fatalf("%d failovers, hits %v", len(o.failover), o.hits)
		}
		for _, want := range []string{"context_length_exceeded", "History compaction had timed out after 300ms (timeouts.compaction)",
			"context.compact_at", "limits.max_tool_output"} {
			if !strings.Contains(r.Message, want) {
				t.Fatalf("message %q lacks %q", r.Message, want)
			}
		}
	})
}

// A conversation longer than the model's context window, over both wire
// formats (the fakes refuse it as the APIs do): the refusal is recognised,
// the history compacted and the step made again; when even the compaction
// call does not fit, the turn stops with compaction_failed.
func TestChaosLengthRefusal(t *testing.T) {
	manual := agent.Tool{Tool: tool.NewFunc("manual", strings.Repeat("A very long manual. ", 400), nil,
		func(context.Context, json.RawMessage, tool.Progress) (any, error) { return "read", nil })}
	for _, format := range []fakellm.Format{fakellm.OpenAI, fakellm.Anthropic} {
		label := map[fakellm.Format]string{fakellm.OpenAI: "A1", fakellm.Anthropic: "B"}[format]
		only := func(c *chaos) []model.Endpoint {
			for _, ep := range c.endpoints() {
				if ep.Profile == label {
					return []model.Endpoint{ep}
				}
			}
			return nil
		}
		server := func(c *chaos) *fakellm.Server {
			if format == fakellm.Anthropic {
				return c.b
			}
			return c.a
		}
		t.Run(string(format)+": compacted and answered", func(t *testing.T) {
			rs := replies{answer("refused, never sent"), answer("Four long questions, answered at length."), answer("the answer")}
			c := newChaos(t, rs, rs)
			// The tool definitions (~2,000 tokens) and the history (~2,000)
			// do not fit in 3,000 together; the compaction call (the
			// history without tools) and the compacted request do.
			server(c).LimitContext(3000)
			c.compact, c.history, c.tools = 100000, longHistory(), []agent.Tool{manual}
			o := c.run(only(c)...)
			r := o.res.Record
			if r.StopReason != budget.Answered || r.Answer != "the answer" || !slices.Equal(o.hits, []string{label, label, label}) {
				t.Fatalf("got %s, hits %v: %s", r.StopReason, o.hits, r.Message)
			}
			if len(r.ModelCalls) != 3 || r.ModelCalls[0].Outcome != event.OutcomeError || !r.ModelCalls[1].Compaction ||
				r.ModelCalls[1].Outcome != event.OutcomeOK || r.ModelCalls[2].Outcome != event.OutcomeOK {
				t.Fatalf("model calls %+v", r.ModelCalls)
			}
		})
		t.Run(string(format)+": even the compaction does not fit", func(t *testing.T) {
			c := newChaos(t, nil, nil)
			server(c).LimitContext(500)
			c.compact, c.history = 100000, longHistory()
			o := c.run(only(c)...)
			r := o.res.Record
			if r.StopReason != budget.CompactionFailed || r.Status != budget.StatusStopped || !slices.Equal(o.hits, []string{label, label}) || len(o.failover) != 0 {
				t.Fatalf("got %s, hits %v: %s", r.StopReason, o.hits, r.Message)
			}
			for _, want := range []string{"refused it as too long", "History compaction had failed", "context.compact_at", "limits.max_tool_output"} {
				if !strings.Contains(r.Message, want) {
					t.Fatalf("message %q lacks %q", r.Message, want)
				}
			}
		})
	}
}

// sameStopOf checks that the end of a turn its ceiling (b.Turn) stopped is
// the one agent.Agent.StopOf says from its events, as the process
// following a Temporal turn no worker ran ends it: the same message, but
// for its durations, and the same flags.
func sameStopOf(t *testing.T, o outcome, b budget.Budgets) {
	t.Helper()
	r := o.res.Record
	s := &machine.State{TurnID: r.TurnID, Start: r.StartedAt, Budgets: b}
	cause := &machine.Cause{Timeout: b.Turn.Expired(budget.PhaseTurn, "the turn", b.Turn.D)}
	msg, flags, limit := o.agent.StopOf(s, machine.Ending{Reason: budget.TurnTimeout, Cause: cause}, r.Events, nil,
		r.StartedAt.Add(b.Turn.D), r.EndedAt)
	durations := regexp.MustCompile(`\([0-9.]+m?s\)`)
	if got, want := durations.ReplaceAllString(msg, "(…)"), durations.ReplaceAllString(r.Message, "(…)"); got != want || flags != r.Flags ||
		limit == nil || limit.Knob != budget.KeyTurn {
		t.Errorf("StopOf from the events: flags %+v, limit %+v, message %q; the turn's: flags %+v, message %q", flags, limit, msg, r.Flags, r.Message)
	}
}
