package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/telemetry"
	"github.com/timebox-run/timebox/tool"
)

// TestToolSpanNamesTheBudgetThatFired: a call stopped by its idle
// timeout or by the turn's ceiling ends a span that names that budget,
// not the tool's timeout it started with (docs/observability.md).
func TestToolSpanNamesTheBudgetThatFired(t *testing.T) {
	for _, c := range []struct {
		name     string
		idle     time.Duration
		budgets  budget.Budgets
		phase    budget.Phase
		wantMS   int64
		wantKnob string
	}{
		{"idle", 2 * time.Second, budget.Budgets{}, budget.PhaseToolIdle, 2000, "tools[wait].idle_timeout"},
		{"turn", 0, budget.Budgets{Turn: secs(4*time.Second, budget.SourceFile, budget.KeyTurn)}, budget.PhaseTurn, 4000, budget.KeyTurn},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tp, rec := recordingTP(t, false)
				wait := agent.Tool{Tool: tool.NewFunc("wait", "waits", nil, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
					<-ctx.Done()
					return nil, ctx.Err()
				}), Budget: budget.ToolBudget{Timeout: budget.Duration{D: time.Minute}, IdleTimeout: budget.Duration{D: c.idle}}}
				p := lines(t, `{"tool_calls": [{"name": "wait"}]}`, `{"text": "ok"}`)
				a, err := agent.New(agent.Config{Name: "traced", Models: []model.Endpoint{endpoint(p, "m")},
					Tools: []agent.Tool{wait}, Budgets: c.budgets, TracerProvider: tp})
				if err != nil {
					t.Fatal(err)
				}
				res := a.Run(t.Context(), agent.Input{Text: "go"})
				if r := toolRecord(t, res, "wait"); r.Phase != c.phase {
					t.Fatalf("the call ended in phase %q (%s), want %q", r.Phase, r.Result, c.phase)
				}
				var found bool
				for _, s := range rec.Ended() {
					if s.Name() != "execute_tool wait" {
						continue
					}
					found = true
					got := spanAttrs(s)
					if got["timebox.budget.ms"] != c.wantMS || got["timebox.budget.knob"] != c.wantKnob || got["timebox.phase"] != string(c.phase) {
						t.Errorf("the span's budget: %v ms, knob %v, phase %v; want %d ms, %s, %s",
							got["timebox.budget.ms"], got["timebox.budget.knob"], got["timebox.phase"], c.wantMS, c.wantKnob, c.phase)
					}
				}
				if !found {
					t.Fatal("no execute_tool span")
				}
			})
		})
	}
}

// TestLostAttemptSpan: a model attempt lost with its worker is recorded by
// the worker that takes the step again; the span the dead worker began
// died with it, so the record's gets one: from the attempt's start,
// error.type interrupted, phase worker_lost — not no span, which reads as
// an attempt that never happened.
func TestLostAttemptSpan(t *testing.T) {
	tp, rec := recordingTP(t, false)
	a, err := agent.New(agent.Config{Name: "traced", Models: []model.Endpoint{endpoint(lines(t, `{"text": "ok"}`), "m")}, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	u, ok := machine.UnitsOf(a)
	if !ok {
		t.Fatal("no units")
	}
	s, _ := u.NewState("t_lost", "", nil, budget.Request{})
	started := time.Now().Add(-3 * time.Second)
	u.LostAttempts(s, 1, []machine.LostAttempt{{Attempt: 1, Model: "m", Provider: "script", Started: started, Last: started.Add(time.Second)}}, "its worker died")
	ended := rec.Ended()
	if len(ended) != 1 || ended[0].Name() != "chat m" {
		t.Fatalf("spans %v; want the lost attempt's chat span", ended)
	}
	sp := ended[0]
	got := spanAttrs(sp)
	if got["error.type"] != "interrupted" || got["timebox.phase"] != "worker_lost" || got["timebox.attempt"] != int64(1) ||
		!sp.StartTime().Equal(started) || sp.Status().Code != codes.Error ||
		!sp.EndTime().Equal(started.Add(time.Second)) { // to its last chunk, not to when the loss was noticed
		t.Errorf("the lost attempt's span: %v, from %s to %s, status %v", got, sp.StartTime(), sp.EndTime(), sp.Status())
	}
}

// TestLostAttemptSpanKeepsItsIDs: the span made of an attempt lost with
// its worker takes the ids its llm_started named — those the model server
// was sent — under the turn's span, so that what the server exported
// under them has its parent (before, ids of its own). An unsampled
// traceparent, or a provider that cannot give the ids, leaves it ids of
// its own, as before.
func TestLostAttemptSpanKeepsItsIDs(t *testing.T) {
	const named = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
	for _, c := range []struct {
		name        string
		traceparent string
		ids         bool // the provider gives the ids asked for
		kept        bool
	}{
		{"sampled", named, true, true},
		{"unsampled", unsampledOf(named), true, false},
		{"untraced", "", true, false},
		{"ids of its own", named, false, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			tp, rec := recordingTP(t, c.ids)
			a, err := agent.New(agent.Config{Name: "traced", Models: []model.Endpoint{endpoint(lines(t, `{"text": "ok"}`), "m")}, TracerProvider: tp})
			if err != nil {
				t.Fatal(err)
			}
			u, _ := machine.UnitsOf(a)
			s, _ := u.NewState("t_lost", "", nil, budget.Request{})
			turn := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" // the runner's span
			s.TraceParent = turn
			started := time.Now().Add(-3 * time.Second)
			u.LostAttempts(s, 1, []machine.LostAttempt{{Attempt: 1, Model: "m", Provider: "script", Started: started, Traceparent: c.traceparent}}, "its worker died")
			ended := rec.Ended()
			if len(ended) != 1 || ended[0].Name() != "chat m" {
				t.Fatalf("spans %v; want the lost attempt's chat span", ended)
			}
			sc := ended[0].SpanContext()
			got := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())
			if kept := got == named; kept != c.kept {
				t.Errorf("the lost attempt's span is %s; its llm_started named %q (want kept: %v)", got, c.traceparent, c.kept)
			}
			if p := ended[0].Parent(); p.SpanID().String() != "b7ad6b7169203331" || p.TraceID().String() != "0af7651916cd43dd8448eb211c80319c" {
				t.Errorf("the lost attempt's span is under %s/%s; want the turn's", p.TraceID(), p.SpanID())
			}
		})
	}
}

// TestChatSpanBegunBeforeItsStart: a model attempt's chat span is begun
// before its llm_started is told, which names it in traceparent: the ids
// its model request carries, which a worker recording the attempt lost
// gives the span it makes. A turn not traced, or whose span is not
// sampled, names none.
func TestChatSpanBegunBeforeItsStart(t *testing.T) {
	for _, c := range []struct {
		name    string
		sampler sdktrace.Sampler // nil: no tracer at all
		named   bool
	}{
		{"sampled", sdktrace.AlwaysSample(), true},
		{"unsampled", sdktrace.NeverSample(), false},
		{"untraced", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			cfg := agent.Config{Name: "traced"}
			if c.sampler != nil {
				tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(c.sampler))
				defer tp.Shutdown(context.Background())
				cfg.TracerProvider = tp
			}
			p := lines(t, `{"error": {"status": 503, "message": "overloaded"}}`, `{"text": "ok"}`)
			cfg.Models = []model.Endpoint{endpoint(p, "m"), endpoint(p, "n")}
			a, err := agent.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			var named []string
			res := a.Run(t.Context(), agent.Input{Text: "go"}, event.SinkFunc(func(e event.Event) {
				if d, ok := e.Data.(*event.LLMStarted); ok {
					named = append(named, d.Traceparent)
				}
			}))
			if res.Record.Status != budget.StatusCompleted || len(named) != 2 {
				t.Fatalf("turn %s (%s), llm_started %q; want two attempts, completed", res.Record.Status, res.Record.Message, named)
			}
			var spans []string
			failovers := 0
			for _, s := range rec.Ended() {
				if strings.HasPrefix(s.Name(), "chat ") {
					spans = append(spans, fmt.Sprintf("00-%s-%s-01", s.SpanContext().TraceID(), s.SpanContext().SpanID()))
					for _, ev := range s.Events() {
						if ev.Name == "failover" && s.Name() == "chat n" {
							failovers++
						}
					}
				}
			}
			if c.named && failovers != 1 {
				t.Errorf("the attempt after the failover tells of it %d times; want once", failovers)
			}
			p.mu.Lock()
			var sent []string
			for _, r := range p.reqs {
				sent = append(sent, r.TraceParent)
			}
			p.mu.Unlock()
			if !c.named {
				if named[0] != "" || named[1] != "" {
					t.Errorf("llm_started named %q; want none", named)
				}
				return
			}
			if !reflect.DeepEqual(named, spans) || !reflect.DeepEqual(named, sent) {
				t.Errorf("llm_started named %q; the chat spans are %q, the model was sent %q", named, spans, sent)
			}
		})
	}
}

// TestCompactionSpan: a compaction is a model call the turn waits for, up
// to timeouts.compaction: it has its chat span, marked as a compaction and
// carrying that budget, between the turn's other spans — not a gap in
// the trace.
func TestCompactionSpan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tp, rec := recordingTP(t, false)
		p := lines(t, `{"compaction": true, "text": "A summary.", "first_chunk_delay": "2s"}`, `{"text": "the answer"}`)
		a, err := agent.New(agent.Config{Name: "traced", Models: []model.Endpoint{endpoint(p, "m")}, CompactAt: 500, TracerProvider: tp})
		if err != nil {
			t.Fatal(err)
		}
		res := a.Run(t.Context(), agent.Input{SessionID: "s", History: longHistory(), Text: "and now?"})
		if res.Record.StopReason != budget.Answered || len(res.Record.ModelCalls) != 2 || !res.Record.ModelCalls[0].Compaction {
			t.Fatalf("turn %s, calls %+v", res.Record.StopReason, res.Record.ModelCalls)
		}
		var compaction []sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			for _, kv := range s.Attributes() {
				if kv.Key == "timebox.compaction" && kv.Value.AsBool() {
					compaction = append(compaction, s)
				}
			}
		}
		if len(compaction) != 1 {
			t.Fatalf("%d compaction spans, want 1", len(compaction))
		}
		s := compaction[0]
		got := spanAttrs(s)
		if s.Name() != "chat m" || got["timebox.budget.knob"] != "timeouts.compaction" || got["timebox.outcome"] != "ok" ||
			s.EndTime().Sub(s.StartTime()) < 2*time.Second || !s.StartTime().Equal(res.Record.ModelCalls[0].StartedAt) {
			t.Errorf("the compaction's span %s: %v, %s to %s", s.Name(), got, s.StartTime(), s.EndTime())
		}
	})
}

// TestApprovalWaitSpan: a call's wait for a person is a span of its own,
// await_approval, a sibling of the tool's execute_tool span under the
// turn's, from the request to the decision, saying how the wait ended and
// who decided — not a gap before the tool's span that reads as the tool's
// or the model's time. The tool's span starts when the tool does.
func TestApprovalWaitSpan(t *testing.T) {
	for _, c := range []struct {
		name     string
		approver agent.Approver
		cancel   time.Duration // the turn is cancelled this long in
		want     map[string]any
		error    bool
		runs     bool
	}{
		{"approved", after(2*time.Second, event.Approve, "alice", "go ahead"), 0,
			map[string]any{"timebox.approval.decision": "approve", "timebox.approval.by": "alice", "timebox.outcome": "ok"}, false, true},
		{"denied", after(2*time.Second, event.Deny, "bob", "not on a Friday"), 0,
			map[string]any{"timebox.approval.decision": "deny", "timebox.approval.by": "bob", "timebox.outcome": "denied", "error.type": "denied"}, true, false},
		{"expired", after(time.Hour, event.Approve, "", ""), 0,
			map[string]any{"timebox.approval.decision": "expired", "timebox.outcome": "approval_expired", "error.type": "approval_expired",
				"timebox.phase": "approval"}, true, false},
		{"stopped while it waits", after(time.Hour, event.Approve, "", ""), 2 * time.Second,
			map[string]any{"timebox.outcome": "cancelled", "error.type": "cancelled"}, true, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				tp, rec := recordingTP(t, false)
				dep := sleepy("deploy", time.Second, 900*time.Millisecond)
				expiry := time.Minute
				if c.name == "expired" {
					expiry = 2 * time.Second
				}
				dep.ApprovalTimeout = secs(expiry, budget.SourceTool, "tools[deploy].approval_timeout in agent.yaml")
				p := lines(t, `{"tool_calls": [{"name": "deploy", "arguments": {}}]}`, `{"text": "done"}`)
				a, err := agent.New(agent.Config{Name: "traced", Models: []model.Endpoint{endpoint(p, "m")}, Tools: []agent.Tool{dep},
					Budgets: approvalBudgets(), TracerProvider: tp})
				if err != nil {
					t.Fatal(err)
				}
				ctx := t.Context()
				if c.cancel > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, c.cancel)
					defer cancel()
				}
				begun := time.Now()
				res := a.Run(ctx, agent.Input{Text: "deploy", Approver: c.approver})
				byName := map[string]sdktrace.ReadOnlySpan{}
				for _, s := range rec.Ended() {
					byName[s.Name()] = s
				}
				turn, wait, exec := byName["invoke_agent traced"], byName["await_approval deploy"], byName["execute_tool deploy"]
				if turn == nil || wait == nil {
					t.Fatalf("spans %v; want the turn's and the wait's", rec.Ended())
				}
				if wait.Parent().SpanID() != turn.SpanContext().SpanID() {
					t.Errorf("the wait's span is not the turn's child")
				}
				got := spanAttrs(wait)
				for k, v := range c.want {
					if got[k] != v {
						t.Errorf("%s = %v, want %v (%v)", k, got[k], v, got)
					}
				}
				if got["gen_ai.tool.call.id"] != "call_1_1" || got["gen_ai.tool.name"] != "deploy" || got["timebox.step"] != int64(1) ||
					got["timebox.budget.knob"] != "tools[deploy].approval_timeout in agent.yaml" || got["gen_ai.operation.name"] != nil {
					t.Errorf("the wait's span: %v", got)
				}
				if (wait.Status().Code == codes.Error) != c.error {
					t.Errorf("status %v", wait.Status())
				}
				tr := toolRecord(t, res, "deploy")
				if !wait.StartTime().Equal(begun) || wait.EndTime().Sub(wait.StartTime()) != time.Duration(tr.ApprovalMS)*time.Millisecond ||
					tr.ApprovalMS != 2000 {
					t.Errorf("the wait's span runs %s to %s; the call waited %d ms from %s", wait.StartTime(), wait.EndTime(), tr.ApprovalMS, begun)
				}
				if (exec != nil) != c.runs {
					t.Fatalf("execute_tool span: %v, want %v", exec != nil, c.runs)
				}
				if exec != nil && (exec.Parent().SpanID() != turn.SpanContext().SpanID() || exec.StartTime().Before(wait.EndTime()) ||
					exec.EndTime().Sub(exec.StartTime()) != 900*time.Millisecond) {
					t.Errorf("the tool's span runs %s to %s, the wait's ends %s", exec.StartTime(), exec.EndTime(), wait.EndTime())
				}
			})
		})
	}
}

// TestTraceEnded: a turn whose process died before it ended its span gets
// that span from the process that ends the turn, with the ids it began
// with — the parent the spans of its calls name — under the caller's span,
// with the attributes the turn's own end gives it. Not while the span is
// open in this process, not for a turn not sampled, and not when the
// TracerProvider cannot give the ids (the span would be a stranger).
func TestTraceEnded(t *testing.T) {
	first, firstRec := recordingTP(t, true)
	a, err := agent.New(agent.Config{Name: "traced", Models: []model.Endpoint{endpoint(lines(t, `{"text": "ok"}`), "m")},
		Budgets: budget.Budgets{Turn: secs(time.Minute, budget.SourceFile, budget.KeyTurn)}, TracerProvider: first})
	if err != nil {
		t.Fatal(err)
	}
	again, againRec := recordingTP(t, true)
	var started *event.TurnStarted
	caller := agent.WithTraceParent(t.Context(), "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	res := a.Run(caller, agent.Input{Text: "go", SessionID: "s1"}, event.SinkFunc(func(e event.Event) {
		if d, ok := e.Data.(*event.TurnStarted); ok {
			started = d
			// Its span is open here: its own end makes it.
			agent.TraceEnded(again, e.TurnID, d, &event.Turn{Status: budget.StatusInterrupted}, nil)
		}
	}))
	if started == nil || started.Traceparent == "" || started.CallerTraceparent != "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" {
		t.Fatalf("turn_started %+v: want the turn's traceparent and its caller's", started)
	}
	noneMadeWhileOpen(t, againRec)
	orig := endedNamed(firstRec, "invoke_agent traced")
	if orig == nil {
		t.Fatal("no turn span")
	}

	rec := *res.Record
	rec.Status, rec.StopReason, rec.Message = budget.StatusInterrupted, budget.Interrupted, "Interrupted: its process stopped."
	agent.TraceEnded(again, res.Record.TurnID, started, &rec, nil)
	made := againRec.Ended()
	if len(made) != 1 {
		t.Fatalf("%d spans made; want the turn's", len(made))
	}
	s := made[0]
	if s.Name() != orig.Name() || s.SpanContext().TraceID() != orig.SpanContext().TraceID() ||
		s.SpanContext().SpanID() != orig.SpanContext().SpanID() || s.Parent().SpanID() != orig.Parent().SpanID() ||
		!s.StartTime().Equal(orig.StartTime()) || !s.EndTime().Equal(rec.EndedAt) {
		t.Errorf("made %s %s/%s under %s, %s–%s; want %s %s/%s under %s from %s",
			s.Name(), s.SpanContext().TraceID(), s.SpanContext().SpanID(), s.Parent().SpanID(), s.StartTime(), s.EndTime(),
			orig.Name(), orig.SpanContext().TraceID(), orig.SpanContext().SpanID(), orig.Parent().SpanID(), orig.StartTime())
	}
	want := spanAttrs(orig)
	want["timebox.outcome"], want["timebox.stop_reason"], want["error.type"] = "interrupted", "interrupted", "interrupted"
	if got := spanAttrs(s); !reflect.DeepEqual(got, want) {
		t.Errorf("attributes %v\nwant %v", got, want)
	}
	if s.Status().Code != codes.Error || s.Status().Description != rec.Message {
		t.Errorf("status %v", s.Status())
	}

	// A provider that gives ids of its own: no stranger span.
	foreign, foreignRec := recordingTP(t, false)
	agent.TraceEnded(foreign, res.Record.TurnID, started, &rec, nil)
	// A turn not sampled, or not traced: nothing.
	unsampled := *started
	unsampled.Traceparent = unsampledOf(started.Traceparent)
	agent.TraceEnded(again, res.Record.TurnID, &unsampled, &rec, nil)
	agent.TraceEnded(again, res.Record.TurnID, &event.TurnStarted{Agent: "traced"}, &rec, nil)
	if n, m := len(foreignRec.Ended()), len(againRec.Ended()); n != 0 || m != 1 {
		t.Errorf("%d spans of a provider that cannot give the ids, %d more for untraced turns; want none", n, m-1)
	}
}

// TestTraceEndedCalls: a call that was running when its turn's process
// died gets its execute_tool span from the process that ends the turn,
// beside the turn's: with the ids its tool_started carries — those of the
// span its process began, which the tool was given — under the turn's
// span, with the attributes that span began with and its record's
// outcome, from its start to the turn's end. None for a call whose
// tool_started has no sampled traceparent, and none while the turn's span
// is open here (its own process ends them).
func TestTraceEndedCalls(t *testing.T) {
	first, firstRec := recordingTP(t, true)
	var given string // the traceparent the tool was given
	crawl := goTool("crawl", budget.Hard, time.Minute, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
		return "done", nil
	})
	crawl.Tool = &notingTool{Tool: crawl.Tool, traceparent: &given}
	a, err := agent.New(agent.Config{Name: "traced", Models: []model.Endpoint{endpoint(lines(t,
		`{"tool_calls": [{"name": "crawl", "arguments": {}}]}`, `{"text": "ok"}`), "m")},
		Tools:   []agent.Tool{crawl},
		Budgets: budget.Budgets{Turn: secs(time.Minute, budget.SourceFile, budget.KeyTurn)}, TracerProvider: first})
	if err != nil {
		t.Fatal(err)
	}
	again, againRec := recordingTP(t, true)
	var (
		started *event.TurnStarted
		call    *event.ToolStarted
	)
	res := a.Run(t.Context(), agent.Input{Text: "go"}, event.SinkFunc(func(e event.Event) {
		switch d := e.Data.(type) {
		case *event.TurnStarted:
			started = d
		case *event.ToolStarted:
			call = d
			// Open here: its own process ends it.
			agent.TraceEnded(again, e.TurnID, started, &event.Turn{Status: budget.StatusInterrupted}, nil,
				event.LostCall{Started: d, Record: event.ToolCall{CallID: d.CallID, Outcome: event.OutcomeInterrupted}})
		}
	}))
	if call == nil || call.Traceparent == "" || call.Knob != "tools[crawl].timeout in agent.yaml" {
		t.Fatalf("tool_started %+v: want the call's traceparent and knob", call)
	}
	noneMadeWhileOpen(t, againRec)
	orig, turn := endedNamed(firstRec, "execute_tool crawl"), endedNamed(firstRec, "invoke_agent traced")
	if orig == nil || turn == nil {
		t.Fatal("no call or turn span")
	}
	if tp := fmt.Sprintf("00-%s-%s-01", orig.SpanContext().TraceID(), orig.SpanContext().SpanID()); call.Traceparent != tp || given != tp {
		t.Fatalf("tool_started names %s, the tool was given %s; the call's span is %s", call.Traceparent, given, tp)
	}

	rec := *res.Record
	rec.Status, rec.StopReason, rec.Message = budget.StatusInterrupted, budget.Interrupted, "Interrupted: its process stopped."
	rec.EndedAt = res.Record.EndedAt.Add(time.Second)
	lost := res.Record.ToolCalls[0]
	lost.Outcome, lost.Result, lost.EndedAt = event.OutcomeInterrupted, "Interrupted: its process stopped while this call was running.", lost.StartedAt
	agent.TraceEnded(again, rec.TurnID, started, &rec, nil, event.LostCall{Started: call, Record: lost})
	made := endedNamed(againRec, "execute_tool crawl")
	if n := len(againRec.Ended()); n != 2 || made == nil {
		t.Fatalf("%d spans made; want the turn's and the call's", n)
	}
	checkRemade(t, made, orig, turn, lost.StartedAt, rec.EndedAt)
	want := spanAttrs(orig)
	want["timebox.outcome"], want["error.type"] = "interrupted", "interrupted"
	if got := spanAttrs(made); !reflect.DeepEqual(got, want) {
		t.Errorf("attributes %v\nwant %v", got, want)
	}
	if made.Status().Code != codes.Error || made.Status().Description != lost.Result {
		t.Errorf("status %v", made.Status())
	}

	// A call not sampled: its turn's span alone.
	unsampled := *call
	unsampled.Traceparent = unsampledOf(call.Traceparent)
	agent.TraceEnded(again, rec.TurnID, started, &rec, nil, event.LostCall{Started: &unsampled, Record: lost})
	if n := len(againRec.Ended()); n != 3 {
		t.Errorf("%d spans made for a call not sampled and its turn; want its turn's", n-2)
	}
}

// TestResumedTurnSpan: a turn suspended while its call waits for a person
// (a server stopping) and resumed by another process (its TracerProvider
// another) has one invoke_agent span, made by the process that ends it,
// with the ids its calls' spans name as their parent, under the caller's
// span, from the turn's start. Before, neither made it: the suspending
// process left it unended and Resume began none, so every span of the
// turn named a parent no collector received.
func TestResumedTurnSpan(t *testing.T) {
	newAgent := func(tp *sdktrace.TracerProvider, p model.Provider) *agent.Agent {
		a, err := agent.New(agent.Config{Name: "traced", Models: []model.Endpoint{endpoint(p, "m")},
			Tools: []agent.Tool{sleepy("deploy", time.Second, 0)}, Budgets: approvalBudgets(), TracerProvider: tp})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	const caller = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	firstTP, firstRec := recordingTP(t, true)
	first := newAgent(firstTP, lines(t, `{"tool_calls": [{"name": "deploy", "arguments": {}}]}`))
	suspend := make(chan struct{})
	waiting := agent.ApproverFunc(func(ctx context.Context, req agent.ApprovalRequest) (agent.Decision, error) {
		close(suspend)
		<-ctx.Done()
		return agent.Decision{}, ctx.Err()
	})
	var started *event.TurnStarted
	res := first.Run(agent.WithTraceParent(t.Context(), caller), agent.Input{Text: "deploy", Approver: waiting, Suspend: suspend},
		event.SinkFunc(func(e event.Event) {
			if d, ok := e.Data.(*event.TurnStarted); ok {
				started = d
			}
		}))
	if res.Suspended == nil || started == nil {
		t.Fatalf("not suspended (%v), or no turn_started", res.Record)
	}
	firstTP.ForceFlush(t.Context())

	againTP, againRec := recordingTP(t, true)
	again := newAgent(againTP, lines(t, `{"text": "deployed"}`))
	res, err := again.Resume(t.Context(), res.Suspended, agent.Input{Approver: after(0, event.Approve, "alice", "")})
	if err != nil || res.Record == nil || res.Record.StopReason != budget.Answered {
		t.Fatalf("resumed: %v %+v", err, res)
	}
	var spans []sdktrace.ReadOnlySpan
	spans = append(spans, firstRec.Ended()...)
	spans = append(spans, againRec.Ended()...)
	var turns []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if strings.HasPrefix(s.Name(), "invoke_agent ") {
			turns = append(turns, s)
		}
	}
	if len(turns) != 1 {
		t.Fatalf("%d invoke_agent spans; want 1", len(turns))
	}
	turn := turns[0]
	if got := "00-" + turn.SpanContext().TraceID().String() + "-" + turn.SpanContext().SpanID().String() + "-01"; got != started.Traceparent {
		t.Errorf("the turn's span is %s; turn_started named %s", got, started.Traceparent)
	}
	if turn.Parent().SpanID().String() != "b7ad6b7169203331" || !turn.StartTime().Equal(res.Record.StartedAt) {
		t.Errorf("the turn's span: under %s from %s; want under the caller's, from the turn's start %s", turn.Parent().SpanID(), turn.StartTime(), res.Record.StartedAt)
	}
	if !turn.EndTime().Equal(res.Record.EndedAt) {
		t.Errorf("the turn's span ends %s; the turn %s", turn.EndTime(), res.Record.EndedAt)
	}
	for _, s := range spans {
		if s != turn && s.Parent().SpanID() != turn.SpanContext().SpanID() {
			t.Errorf("span %s names parent %s, not the turn's", s.Name(), s.Parent().SpanID())
		}
	}
	if len(spans) < 3 {
		t.Errorf("%d spans; want the turn's, the model calls' and the tool call's", len(spans))
	}
}

// notingTool notes the traceparent its call is given.
type notingTool struct {
	tool.Tool
	traceparent *string
}

func (n *notingTool) Call(ctx context.Context, c *tool.Call) (*tool.Result, error) {
	*n.traceparent = c.TraceParent
	return n.Tool.Call(ctx, c)
}

// TestTraceEndedAttempt: a model attempt under way when its turn's
// process died gets its chat span from the process that ends the turn,
// beside the turn's: with the ids its llm_started carries — those the
// model server was sent as its traceparent header — under the turn's
// span, with the attributes its live span began with, outcome and
// error.type interrupted, an error status, from its start to when it is
// known to have run until. None for an attempt not sampled, and none
// while the turn's span is open here (its own process ends it).
func TestTraceEndedAttempt(t *testing.T) {
	first, firstRec := recordingTP(t, true)
	a, err := agent.New(agent.Config{Name: "traced", Models: []model.Endpoint{endpoint(lines(t, `{"text": "ok"}`), "m")},
		Budgets: budget.Budgets{Turn: secs(time.Minute, budget.SourceFile, budget.KeyTurn),
			LLMFirstChunk: secs(30*time.Second, budget.SourceFile, budget.KeyLLMFirstChunk)}, TracerProvider: first})
	if err != nil {
		t.Fatal(err)
	}
	again, againRec := recordingTP(t, true)
	var (
		started *event.TurnStarted
		lost    *event.LostAttempt
	)
	res := a.Run(t.Context(), agent.Input{Text: "go"}, event.SinkFunc(func(e event.Event) {
		switch d := e.Data.(type) {
		case *event.TurnStarted:
			started = d
		case *event.LLMStarted:
			lost = &event.LostAttempt{Started: d, At: e.At, Until: e.At.Add(700 * time.Millisecond)}
			// Open here: its own process ends it.
			agent.TraceEnded(again, e.TurnID, started, &event.Turn{Status: budget.StatusInterrupted}, lost)
		}
	}))
	if lost == nil || lost.Started.Traceparent == "" {
		t.Fatalf("llm_started %+v: want the attempt's traceparent", lost)
	}
	noneMadeWhileOpen(t, againRec)
	orig, turn := endedNamed(firstRec, "chat m"), endedNamed(firstRec, "invoke_agent traced")
	if orig == nil || turn == nil {
		t.Fatal("no chat or turn span")
	}

	rec := *res.Record
	rec.Status, rec.StopReason, rec.Message = budget.StatusInterrupted, budget.Interrupted, "Interrupted: its process stopped. Model m was answering."
	rec.EndedAt = lost.Until.Add(time.Second) // the turn's end, later than what is known of the attempt
	agent.TraceEnded(again, rec.TurnID, started, &rec, lost)
	made := endedNamed(againRec, "chat m")
	if n := len(againRec.Ended()); n != 2 || made == nil {
		t.Fatalf("%d spans made; want the turn's and the attempt's", n)
	}
	checkRemade(t, made, orig, turn, lost.At, lost.Until)
	if made.SpanKind() != orig.SpanKind() {
		t.Errorf("kind %v, want %v", made.SpanKind(), orig.SpanKind())
	}
	want := spanAttrs(orig)
	// What the live span was told at its end, which never came.
	delete(want, "gen_ai.usage.input_tokens")
	delete(want, "gen_ai.usage.output_tokens")
	want["timebox.outcome"], want["error.type"] = "interrupted", "interrupted"
	if got := spanAttrs(made); !reflect.DeepEqual(got, want) {
		t.Errorf("attributes %v\nwant %v", got, want)
	}
	if want["timebox.budget.knob"] == nil {
		t.Errorf("the live span names no budget: %v", want)
	}
	if made.Status().Code != codes.Error || made.Status().Description != rec.Message {
		t.Errorf("status %v", made.Status())
	}

	// An attempt not sampled: its turn's span alone.
	unsampled := *lost.Started
	unsampled.Traceparent = unsampledOf(lost.Started.Traceparent)
	agent.TraceEnded(again, rec.TurnID, started, &rec, &event.LostAttempt{Started: &unsampled, At: lost.At, Until: lost.Until})
	if n := len(againRec.Ended()); n != 3 {
		t.Errorf("%d spans made for an attempt not sampled and its turn; want its turn's", n-2)
	}
}

// recordingTP returns a TracerProvider that records the spans it ends,
// shut down when the test ends. With ids it gives a span the ids its
// context asks for (telemetry.IDs), as timebox's own providers do, so
// that a span made by another process can take the ids of the one that
// died; without, ids of its own.
func recordingTP(t *testing.T, ids bool) (*sdktrace.TracerProvider, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	opts := []sdktrace.TracerProviderOption{sdktrace.WithSpanProcessor(rec)}
	if ids {
		opts = append(opts, sdktrace.WithIDGenerator(telemetry.IDs{}))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	t.Cleanup(func() { tp.Shutdown(context.Background()) })
	return tp, rec
}

// spanAttrs returns the attributes of s by key.
func spanAttrs(s sdktrace.ReadOnlySpan) map[string]any {
	m := map[string]any{}
	for _, kv := range s.Attributes() {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

// endedNamed returns the last span rec saw end with that name, or nil.
func endedNamed(rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	var found sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == name {
			found = s
		}
	}
	return found
}

// unsampledOf returns a sampled traceparent with its sampled flag off.
func unsampledOf(traceparent string) string {
	return strings.TrimSuffix(traceparent, "01") + "00"
}

// noneMadeWhileOpen fails t when rec has seen a span end: TraceEnded was
// called while the turn's span was open in this process, whose own end
// makes the spans.
func noneMadeWhileOpen(t *testing.T, rec *tracetest.SpanRecorder) {
	t.Helper()
	if n := len(rec.Ended()); n != 0 {
		t.Fatalf("%d spans made for a turn whose span was open", n)
	}
}

// checkRemade checks that made, a span TraceEnded made for one that died
// with its process, has orig's ids, is under the turn's span and runs
// from start to end.
func checkRemade(t *testing.T, made, orig, turn sdktrace.ReadOnlySpan, start, end time.Time) {
	t.Helper()
	if made.SpanContext().TraceID() != orig.SpanContext().TraceID() || made.SpanContext().SpanID() != orig.SpanContext().SpanID() ||
		made.Parent().SpanID() != turn.SpanContext().SpanID() || !made.StartTime().Equal(start) || !made.EndTime().Equal(end) {
		t.Errorf("made %s/%s under %s, %s–%s; want %s/%s under %s, %s–%s", made.SpanContext().TraceID(), made.SpanContext().SpanID(),
			made.Parent().SpanID(), made.StartTime(), made.EndTime(), orig.SpanContext().TraceID(), orig.SpanContext().SpanID(),
			turn.SpanContext().SpanID(), start, end)
	}
}

// TestCompactionSpanNamedAndMadeAgain: a compaction's chat span is begun
// before its start is told, so that compaction_started names its ids,
// those its model request carries (before, its span was made from its
// record when it ended, and nothing named it); and a compaction under way
// when its turn's process died gets that span from who ends the turn
// (TraceEnded with the compaction as the lost attempt): its ids, under
// the turn's span, with the attributes it began with, interrupted, from
// its start to what is known of it.
func TestCompactionSpanNamedAndMadeAgain(t *testing.T) {
	first, firstRec := recordingTP(t, true)
	p := lines(t, `{"compaction": true, "text": "A summary."}`, `{"text": "the answer"}`)
	a, err := agent.New(agent.Config{Name: "traced", Models: []model.Endpoint{endpoint(p, "m")}, CompactAt: 500,
		Budgets: budget.Budgets{Turn: secs(time.Minute, budget.SourceFile, budget.KeyTurn),
			Compaction: secs(20*time.Second, budget.SourceFile, budget.KeyCompaction)}, TracerProvider: first})
	if err != nil {
		t.Fatal(err)
	}
	var (
		started *event.TurnStarted
		lost    *event.LostAttempt
	)
	res := a.Run(t.Context(), agent.Input{SessionID: "s", History: longHistory(), Text: "and now?"}, event.SinkFunc(func(e event.Event) {
		switch d := e.Data.(type) {
		case *event.TurnStarted:
			started = d
		case *event.CompactionStarted:
			lost = &event.LostAttempt{Compaction: d, At: e.At, Until: e.At.Add(700 * time.Millisecond)}
		}
	}))
	if res.Record.StopReason != budget.Answered || lost == nil || lost.Compaction.Traceparent == "" || lost.Compaction.Model != "m" {
		t.Fatalf("turn %s, compaction_started %+v: want the compaction's traceparent and model", res.Record.StopReason, lost)
	}
	var orig, turn sdktrace.ReadOnlySpan
	for _, s := range firstRec.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == "timebox.compaction" {
				orig = s
			}
		}
		if s.Name() == "invoke_agent traced" {
			turn = s
		}
	}
	if orig == nil || turn == nil {
		t.Fatal("no compaction or turn span")
	}
	ids := fmt.Sprintf("00-%s-%s-01", orig.SpanContext().TraceID(), orig.SpanContext().SpanID())
	p.mu.Lock()
	sent := p.reqs[0].TraceParent
	p.mu.Unlock()
	if lost.Compaction.Traceparent != ids || sent != ids {
		t.Errorf("compaction_started named %s, the model was sent %s; its span is %s", lost.Compaction.Traceparent, sent, ids)
	}

	again, againRec := recordingTP(t, true)
	rec := *res.Record
	rec.Status, rec.StopReason, rec.Message = budget.StatusInterrupted, budget.Interrupted, "Interrupted: its process stopped."
	rec.EndedAt = lost.Until.Add(time.Second)
	agent.TraceEnded(again, rec.TurnID, started, &rec, lost)
	made := endedNamed(againRec, "chat m")
	if n := len(againRec.Ended()); n != 2 || made == nil {
		t.Fatalf("%d spans made; want the turn's and the compaction's", n)
	}
	checkRemade(t, made, orig, turn, lost.At, lost.Until)
	want := spanAttrs(orig)
	want["timebox.outcome"], want["error.type"] = "interrupted", "interrupted"
	if got := spanAttrs(made); !reflect.DeepEqual(got, want) || want["timebox.budget.knob"] != budget.KeyCompaction {
		t.Errorf("attributes %v\nwant %v, under timeouts.compaction", got, want)
	}
	if made.Status().Code != codes.Error || made.Status().Description != rec.Message {
		t.Errorf("status %v", made.Status())
	}
}

// disowner is a sink whose unit the engine gave up (event.Disowner).
type disowner struct{}

func (disowner) Emit(event.Event) {}
func (disowner) Disowned() bool   { return true }

// TestDisownedCompactionLeavesItsSpan: a unit the engine gave up ends no
// compaction span, as it ends no attempt's: the worker that records the
// compaction lost makes that span, with the ids its compaction_started
// named, and one ended here too would be a second of those ids.
func TestDisownedCompactionLeavesItsSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	p := lines(t, `{"compaction": true, "text": "A summary."}`, `{"text": "the answer"}`)
	a, err := agent.New(agent.Config{Name: "traced", Models: []model.Endpoint{endpoint(p, "m")}, CompactAt: 500, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	res := a.Run(t.Context(), agent.Input{SessionID: "s", History: longHistory(), Text: "and now?"}, disowner{})
	if len(res.Record.ModelCalls) != 2 || !res.Record.ModelCalls[0].Compaction {
		t.Fatalf("turn %s, calls %+v; want a compaction", res.Record.StopReason, res.Record.ModelCalls)
	}
	for _, s := range rec.Ended() {
		for _, kv := range s.Attributes() {
			if kv.Key == "timebox.compaction" {
				t.Errorf("a disowned unit ended the compaction's span %s", s.Name())
			}
		}
	}
}
