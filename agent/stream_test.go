package agent_test

// Streams that do not behave: a model that never stops (limits.max_reply,
// the turn ceiling while a stream is read) and a model that returns nothing
// (an empty reply). They run in the chaos harness: the real providers
// against fakellm on loopback, a chain of OpenAI gpt-a (A1, A2) then
// Anthropic claude-b (B).

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/fakellm"
	"github.com/timebox-run/timebox/model"
)

// endless streams text chunks of n bytes for ever.
func endless(n int) fakellm.Reply {
	return fakellm.Reply{Repeat: true, Chunks: []fakellm.Chunk{{Text: strings.Repeat("all work and no play ", n/21+1)[:n]}}}
}

// paced delays each chunk of r by d.
func paced(r fakellm.Reply, d time.Duration) fakellm.Reply {
	for i := range r.Chunks {
		r.Chunks[i].Delay = d
	}
	return r
}

// endlessCall streams one tool call whose arguments never end.
func endlessCall(n int) fakellm.Reply {
	return fakellm.Reply{Repeat: true, Chunks: []fakellm.Chunk{
		{Tool: &fakellm.ToolFragment{ID: "call_1", Name: "echo"}},
		{Tool: &fakellm.ToolFragment{Arguments: strings.Repeat("x", n)}}}}
}

// patient gives the model watchdogs room: the scenarios below are not
// about silence, and on a loaded machine the chaos harness's 300ms could
// fire before a reply's first chunk.
func patient(c *chaos, d time.Duration) {
	c.budgets.LLMFirstChunk = budget.Duration{D: d, Source: budget.SourceFile, Knob: budget.KeyLLMFirstChunk}
	c.budgets.LLMIdle = budget.Duration{D: d, Source: budget.SourceFile, Knob: budget.KeyLLMIdle}
}

// gone waits until the fake's client of request n has gone away.
func gone(t *testing.T, s *fakellm.Server, n int) {
	t.Helper()
	select {
	case <-s.Gone(n):
	case <-time.After(10 * time.Second):
		t.Fatalf("the stream of request %d is still open", n)
	}
}

// TestChaosReplyCap: a reply that grows past limits.max_reply is cut there,
// its stream closed, and the turn stops reply_too_long with a message that
// names the knob as its source says. No other credential or model is
// tried: the cap is not a provider failure.
func TestChaosReplyCap(t *testing.T) {
	cap64K := budget.Count{N: 64 << 10, Source: budget.SourceFlag, Knob: "--max-reply"}
	cases := []struct {
		name   string
		a, b   replies
		limit  budget.Count // zero: the default, 1MiB
		hits   []string
		phases []budget.Phase
		reason budget.StopReason
		msg    []string
		// partial says whether text is kept as the partial answer.
		partial bool
	}{
		{name: "endless text", a: replies{endless(16 << 10)}, hits: []string{"A1"},
			phases: []budget.Phase{budget.PhaseLLMReplyCap}, reason: budget.ReplyTooLong, partial: true,
			msg: []string{"the reply of model gpt-a grew past 1MiB, the limit for one reply (limits.max_reply)",
				"kept as the partial answer", "No other model was tried", "raise limits.max_reply"}},
		{name: "endless tool-call arguments", a: replies{endlessCall(4 << 10)}, hits: []string{"A1"},
			phases: []budget.Phase{budget.PhaseLLMReplyCap}, reason: budget.ReplyTooLong,
			msg: []string{"grew past 1MiB", "Nothing of it is kept", "raise limits.max_reply"}},
		{name: "the knob as its source says", a: replies{endless(4 << 10)}, limit: cap64K, hits: []string{"A1"},
			phases: []budget.Phase{budget.PhaseLLMReplyCap}, reason: budget.ReplyTooLong, partial: true,
			msg: []string{"grew past 64KiB, the limit for one reply (--max-reply)", "raise --max-reply"}},
		{name: "the fallback writes without end: the cap stops it there too",
			a: replies{{Status: 500, Message: "boom"}}, b: replies{endless(16 << 10)}, hits: []string{"A1", "A2", "B"},
			phases: []budget.Phase{budget.PhaseLLMHTTP, budget.PhaseLLMHTTP, budget.PhaseLLMReplyCap}, reason: budget.ReplyTooLong,
			partial: true, msg: []string{"the reply of model claude-b grew past 1MiB"}},
		{name: "a long reply under the cap is an answer",
			a:    replies{{Chunks: slices.Repeat([]fakellm.Chunk{{Text: strings.Repeat("y", 60<<10)}}, 15)}},
			hits: []string{"A1"}, reason: budget.Answered},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newChaos(t, tc.a, tc.b)
			patient(c, 5*time.Second)
			if tc.limit.N > 0 {
				c.limits.MaxReply = tc.limit
			}
			o := c.run()
			r := o.res.Record
			if r.StopReason != tc.reason || r.Status != tc.reason.Status() {
				t.Fatalf("%s/%s: %s", r.Status, r.StopReason, r.Message)
			}
			if !slices.Equal(o.hits, tc.hits) || !slices.Equal(o.phases, tc.phases) {
				t.Fatalf("hits %v in phases %v, want %v in %v", o.hits, o.phases, tc.hits, tc.phases)
			}
			if want := len(tc.hits) - 1; len(o.failover) != want {
				t.Fatalf("%d failovers, want %d (none after the cap)", len(o.failover), want)
			}
			for _, s := range tc.msg {
				if !strings.Contains(r.Message, s) {
					t.Errorf("message %q lacks %q", r.Message, s)
				}
			}
			if tc.reason == budget.Answered {
				if len(r.Answer) != 15*60<<10 {
					t.Fatalf("answer of %d bytes", len(r.Answer))
				}
				return
			}
			last := r.ModelCalls[len(r.ModelCalls)-1]
			if last.Phase != budget.PhaseLLMReplyCap || last.Outcome != event.OutcomeError || !strings.Contains(last.Error, "grew past") {
				t.Fatalf("model call record %+v", last)
			}
			// The partial answer runs right up to the cap, and no further.
			limit := c.limits.MaxReply.N
			if tc.partial && int64(len(r.Answer)) != limit || !tc.partial && r.Answer != "" {
				t.Fatalf("partial answer of %d bytes, cap %d", len(r.Answer), limit)
			}
			// The stream was closed, not left running.
			srv := c.a
			if tc.hits[len(tc.hits)-1] == "B" {
				srv = c.b
			}
			gone(t, srv, len(srv.Requests())-1)
			if o.elapsed > 10*time.Second {
				t.Fatalf("the turn took %s", o.elapsed)
			}
		})
	}
}

// TestChaosTurnCeilingWhileStreaming: the turn ceiling ends the turn on
// time whatever the stream does — a flood past any reasonable cap, a
// trickle of tiny chunks, a single event whose bytes trickle in. The bound
// here is generous (a second past a one-second turn, on a loaded machine);
// bench/stream measures the real figure.
func TestChaosTurnCeilingWhileStreaming(t *testing.T) {
	cases := []struct {
		name  string
		reply fakellm.Reply
	}{
		// 10 MiB/s: a flood, yet one that does not reach max_reply's
		// maximum (16 MiB) before the 1s ceiling. Unpaced, a fast machine
		// got there in 200ms and the turn ended reply_too_long.
		{name: "a flood of 256 KiB chunks, max_reply raised to its maximum", reply: paced(endless(256<<10), 25*time.Millisecond)},
		{name: "a one-byte chunk every 10ms", reply: fakellm.Reply{Repeat: true, Chunks: []fakellm.Chunk{{Text: "x", Delay: 10 * time.Millisecond}}}},
		{name: "one event whose bytes trickle in", reply: fakellm.Reply{ByteDelay: 5 * time.Millisecond, Chunks: []fakellm.Chunk{{Text: strings.Repeat("z", 4096)}}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newChaos(t, replies{tc.reply}, nil)
			patient(c, time.Minute)
			c.budgets.Turn = budget.Duration{D: time.Second, Source: budget.SourceFile, Knob: budget.KeyTurn}
			c.limits.MaxReply = budget.Count{N: 16 << 20, Source: budget.SourceFile, Knob: budget.KeyMaxReply}
			o := c.run()
			r := o.res.Record
			if r.StopReason != budget.TurnTimeout || !r.Flags.TimedOutByTurnBudget || r.Flags.TimedOutDuringToolExecution {
				t.Fatalf("%s %+v: %s", r.StopReason, r.Flags, r.Message)
			}
			past := time.Duration(r.WallMS)*time.Millisecond - time.Second
			if past > time.Second || o.elapsed > 2*time.Second {
				t.Fatalf("the turn ended %s past its 1s ceiling (Run returned after %s)", past, o.elapsed)
			}
			t.Logf("the turn ended %s past its ceiling; Run returned after %s; %d bytes of partial answer", past, o.elapsed, len(r.Answer))
			if !slices.Equal(o.hits, []string{"A1"}) || len(o.failover) != 0 {
				t.Fatalf("hits %v, %d failovers", o.hits, len(o.failover))
			}
			if !strings.Contains(r.Message, "Last step: model gpt-a") {
				t.Errorf("message %q", r.Message)
			}
			gone(t, c.a, 0)
		})
	}
}

// empty is a reply with nothing in it, ending for reason (the natural one
// when "").
func empty(reason string) fakellm.Reply {
	return fakellm.Reply{Chunks: []fakellm.Chunk{{Text: ""}}, FinishReason: reason}
}

// TestChaosEmptyReply: a reply with neither text nor tool call is a model
// failure (phase llm_empty): the same endpoint is asked once more, then the
// chain moves on; when every attempt returned nothing the turn fails with a
// message that says so. A model that spent its whole output allowance is
// not asked again, and the message names model.max_tokens.
func TestChaosEmptyReply(t *testing.T) {
	e := budget.PhaseLLMEmpty
	cases := []struct {
		name    string
		a, b    replies
		breaker int64
		hits    []string
		phases  []budget.Phase
		reason  budget.StopReason
		answer  string
		msg     []string
		// to is where each failover went.
		to []string
	}{
		{name: "asked once more, it answers", a: replies{empty(""), answer("from A1 again")},
			hits: []string{"A1", "A1"}, phases: []budget.Phase{e}, reason: budget.Answered, answer: "from A1 again", to: []string{"A1"}},
		{name: "white space is nothing", a: replies{fakellm.Text(" \n ", 0), answer("now")},
			hits: []string{"A1", "A1"}, phases: []budget.Phase{e}, reason: budget.Answered, answer: "now", to: []string{"A1"}},
		{name: "empty twice: the next credential", a: replies{empty(""), empty(""), answer("from A2")},
			hits: []string{"A1", "A1", "A2"}, phases: []budget.Phase{e, e}, reason: budget.Answered, answer: "from A2", to: []string{"A1", "A2"}},
		{name: "nothing from anyone", a: replies{empty("")}, b: replies{empty("")},
			hits: []string{"A1", "A1", "A2", "B"}, phases: []budget.Phase{e, e, e, e}, reason: budget.ModelUnavailable,
			to: []string{"A1", "A2", "B"},
			msg: []string{"the model returned nothing on each of 4 attempts (no text, no tool call)",
				"1) openai:gpt-a with A1: returned nothing, finish reason stop (llm_empty)",
				"4) anthropic:claude-b with B: returned nothing, finish reason end_turn (llm_empty)", "Try again"}},
		{name: "out of tokens: not asked again", a: replies{empty("length"), answer("from A2")},
			hits: []string{"A1", "A2"}, phases: []budget.Phase{e}, reason: budget.Answered, answer: "from A2", to: []string{"A2"}},
		{name: "out of tokens everywhere: raise model.max_tokens", a: replies{empty("length")}, b: replies{empty("max_tokens")},
			hits: []string{"A1", "A2", "B"}, phases: []budget.Phase{e, e, e}, reason: budget.ModelUnavailable, to: []string{"A2", "B"},
			msg: []string{"returned nothing on each of 3 attempts", "finish reason length", "raise model.max_tokens"}},
		{name: "an empty reply between silences does not reset the idle breaker", breaker: 2,
			a:    replies{stallFirst(), empty(""), stallFirst(), answer("never asked")},
			hits: []string{"A1", "A2", "A2"}, phases: []budget.Phase{budget.PhaseLLMFirstChunk, e, budget.PhaseLLMFirstChunk},
			reason: budget.ModelUnresponsive, to: []string{"A2", "A2"}, msg: []string{"went silent 2 times in a row", "no reply within 1s"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := newChaos(t, tc.a, tc.b)
			patient(c, 5*time.Second)
			if tc.breaker > 0 {
				// This one is about silence: a shorter wait for it.
				patient(c, time.Second)
				c.limits.IdleBreaker = budget.Count{N: tc.breaker, Source: budget.SourceFile, Knob: budget.KeyIdleBreaker}
			}
			o := c.run()
			r := o.res.Record
			if r.StopReason != tc.reason || tc.reason == budget.Answered && r.Answer != tc.answer {
				t.Fatalf("%s with %q: %s", r.StopReason, r.Answer, r.Message)
			}
			if !slices.Equal(o.hits, tc.hits) || !slices.Equal(o.phases, tc.phases) {
				t.Fatalf("hits %v in phases %v, want %v in %v", o.hits, o.phases, tc.hits, tc.phases)
			}
			var to []string
			for _, f := range o.failover {
				to = append(to, strings.TrimSuffix(f.To[strings.LastIndex(f.To, "(")+1:], ")"))
			}
			if !slices.Equal(to, tc.to) {
				t.Fatalf("failovers to %v, want %v", to, tc.to)
			}
			for i, m := range r.ModelCalls {
				if m.Phase == e && (m.Outcome != event.OutcomeError || !strings.Contains(m.Error, "empty reply") ||
					i < len(o.failover) && o.failover[i].Phase != e) {
					t.Fatalf("model call %d: %+v", i, m)
				}
			}
			if tc.reason == budget.ModelUnavailable && (r.Answer != "" || r.Status != budget.StatusFailed) {
				t.Fatalf("%s with answer %q", r.Status, r.Answer)
			}
			for _, s := range tc.msg {
				if !strings.Contains(r.Message, s) {
					t.Errorf("message %q lacks %q", r.Message, s)
				}
			}
		})
	}
}

// slowDeltaSink takes d over every llm_delta, as a sink writing to a slow disk or
// terminal would.
type slowDeltaSink struct {
	d      time.Duration
	deltas []string
}

func (s *slowDeltaSink) Emit(e event.Event) {
	if d, ok := e.Data.(*event.LLMDelta); ok {
		s.deltas = append(s.deltas, d.Text)
		time.Sleep(s.d)
	}
}

// TestDeltasFollowTheSinksPace: chunks that arrive while the sinks are still
// busy with the last delta go as one llm_delta, so a flood of tiny chunks is
// not a flood of events; the deltas, joined, are still the reply's text.
func TestDeltasFollowTheSinksPace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		chunks := make([]string, 300)
		for i := range chunks {
			chunks[i] = string(rune('a' + i%26))
		}
		line, _ := json.Marshal(map[string]any{"chunks": chunks})
		a, err := agent.New(agent.Config{Models: []model.Endpoint{endpoint(lines(t, string(line)), "m")}})
		if err != nil {
			t.Fatal(err)
		}
		sink := &slowDeltaSink{d: time.Millisecond}
		res := a.Run(t.Context(), agent.Input{Text: "go"}, sink)
		want := strings.Join(chunks, "")
		if res.Record.StopReason != budget.Answered || res.Record.Answer != want || strings.Join(sink.deltas, "") != want {
			t.Fatalf("%s %q; deltas %q", res.Record.StopReason, res.Record.Answer, strings.Join(sink.deltas, ""))
		}
		if len(sink.deltas) >= len(chunks)/2 {
			t.Fatalf("%d llm_delta events for %d chunks that all arrived at once", len(sink.deltas), len(chunks))
		}
	})
}
