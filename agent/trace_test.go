package agent_test

import (
	"context"
	"encoding/json"
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
				rec := tracetest.NewSpanRecorder()
				tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
				defer tp.Shutdown(context.Background())
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
					got := map[string]any{}
					for _, kv := range s.Attributes() {
						got[string(kv.Key)] = kv.Value.AsInterface()
					}
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
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
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
	got := map[string]any{}
	for _, kv := range sp.Attributes() {
		got[string(kv.Key)] = kv.Value.AsInterface()
	}
	if got["error.type"] != "interrupted" || got["timebox.phase"] != "worker_lost" || got["timebox.attempt"] != int64(1) ||
		!sp.StartTime().Equal(started) || sp.Status().Code != codes.Error ||
		!sp.EndTime().Equal(started.Add(time.Second)) { // to its last chunk, not to when the loss was noticed
		t.Errorf("the lost attempt's span: %v, from %s to %s, status %v", got, sp.StartTime(), sp.EndTime(), sp.Status())
	}
}

// TestCompactionSpan: a compaction is a model call the turn waits for, up
// to timeouts.compaction: it has its chat span, marked as a compaction and
// carrying that budget, between the turn's other spans — not a gap in
// the trace.
func TestCompactionSpan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := tracetest.NewSpanRecorder()
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
		defer tp.Shutdown(context.Background())
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
		got := map[string]any{}
		for _, kv := range s.Attributes() {
			got[string(kv.Key)] = kv.Value.AsInterface()
		}
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
				rec := tracetest.NewSpanRecorder()
				tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
				defer tp.Shutdown(context.Background())
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
				got := map[string]any{}
				for _, kv := range wait.Attributes() {
					got[string(kv.Key)] = kv.Value.AsInterface()
				}
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
