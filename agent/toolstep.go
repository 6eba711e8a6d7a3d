package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/tool"
)

// callUnit runs call c of step's batch under its budget, and puts what the
// model is told into the transcript, after the step's assistant message.
// view is the state the batch began with.
func (t *turn) callUnit(ctx context.Context, view *machine.State, step int, c machine.Call) {
	mc := t.askedFor(view, c)
	result := t.runTool(ctx, step, machine.CallID(step, c.Index), mc, c.Approval, c.Earlier)
	t.tr.Put(view.Messages+c.Index, toolMessage(mc, result))
}

// refuseUnit records calls cs of step's batch as not run — reason is
// machine.RefusedLimit or machine.RefusedCancelled — and puts what the
// model is told into the transcript, each call's in its place.
func (t *turn) refuseUnit(view *machine.State, step int, cs []machine.Call, reason string) {
	var msg string
	switch reason {
	case machine.RefusedLimit:
		lim := view.Limits.MaxToolCalls
		msg = fmt.Sprintf("Not run: this turn reached its limit of %d tool calls (%s).", lim.N, lim.Knob)
	default:
		reason, msg = machine.RefusedCancelled, "Not run: the turn was stopped before this call could start."
	}
	for _, c := range cs {
		mc := t.askedFor(view, c)
		result := t.refuse(step, machine.CallID(step, c.Index), mc, reason, "", msg, nil)
		t.tr.Put(view.Messages+c.Index, toolMessage(mc, result))
	}
}

// askedFor returns call c as the model asked for it: in the step's
// assistant message, the transcript's last when the batch began.
func (t *turn) askedFor(view *machine.State, c machine.Call) model.ToolCall {
	m := t.tr.Message(view.Messages - 1)
	if c.Index < len(m.ToolCalls) {
		return m.ToolCalls[c.Index]
	}
	return model.ToolCall{Name: c.Name} // not reached: the batch is the message's
}

func toolMessage(c model.ToolCall, result string) model.Message {
	return model.Message{Role: model.RoleTool, Content: result, ToolCallID: c.ID, ToolName: c.Name}
}

// arguments returns the model's arguments as JSON for the record: as sent
// when they are JSON, else as a JSON string of the raw text.
func arguments(raw string) json.RawMessage {
	if strings.TrimSpace(raw) == "" {
		return json.RawMessage("{}")
	}
	if json.Valid([]byte(raw)) {
		return json.RawMessage(raw)
	}
	b, _ := json.Marshal(strings.ToValidUTF8(raw, "\uFFFD"))
	return b
}

// refuse records a call that was not run and returns what the model is
// told.
// a, when the call waited for a person first, is that wait.
func (t *turn) refuse(step int, callID string, c model.ToolCall, reason, field, msg string, a *machine.Approved) string {
	now := time.Now()
	res := tool.Refusal(c.Name, reason, field, msg)
	rec := event.ToolCall{CallID: callID, TurnID: t.s.TurnID, Step: step, Tool: c.Name, Arguments: arguments(c.Arguments),
		StartedAt: now, EndedAt: now, Outcome: event.OutcomeError, Refused: reason, Result: res}
	if e, ok := t.a.tools[c.Name]; ok {
		rec.Kind = string(e.Tool.Tool.Kind())
		tb := t.toolBudget(e)
		rec.TimeoutMS, rec.TimeoutSource = tb.Timeout.MS(), tb.Timeout.Source
		rec.Enforcement = tb.Enforcement
	}
	if reason == "cancelled" {
		rec.Outcome, rec.Phase = event.OutcomeCancelled, budget.PhaseCancel
	}
	applyApproval(&rec, a)
	rec = t.addToolRecord(rec)
	t.em.Emit(&event.ToolFinished{ToolCall: rec})
	return res
}

// runTool runs one tool call under its budget and returns what the model is
// told; approved, for a call that waited for a person, is that wait;
// earlier, for a call run again after its worker was lost, its earlier
// runs.
func (t *turn) runTool(ctx context.Context, step int, callID string, c model.ToolCall, approved *machine.Approved, earlier *machine.Earlier) string {
	e, ok := t.a.tools[c.Name]
	if !ok {
		return t.refuse(step, callID, c, event.RefusedUnknownTool, "", fmt.Sprintf("There is no tool named %q. Available tools: %s.",
			c.Name, strings.Join(t.a.order, ", ")), nil)
	}
	args := json.RawMessage(c.Arguments)
	if err := e.schema.Check(args); err != nil {
		var ae *tool.ArgumentError
		errors.As(err, &ae)
		return t.refuse(step, callID, c, ae.Reason, ae.Field, ae.Message+" The tool was not run.", nil)
	}
	if len(strings.TrimSpace(c.Arguments)) == 0 {
		args = json.RawMessage("{}")
	}
	b := t.toolBudget(e)
	start := time.Now()
	var deadline time.Time
	if b.Timeout.D > 0 {
		deadline = start.Add(b.Timeout.D)
	}
	// The call's span is begun before its start is told, so that the
	// start carries its ids: the process that ends the turn makes it again
	// with them when this one dies mid-call (lostCall).
	kind := string(e.Tool.Tool.Kind())
	t.em.Emit(&event.ToolStarted{Step: step, CallID: callID, Tool: c.Name, Kind: kind,
		Arguments: args, TimeoutMS: b.Timeout.MS(), Deadline: deadline.UTC(), Enforcement: b.Enforcement,
		Source: b.Timeout.Source, IdleTimeoutMS: b.IdleTimeout.MS(), Knob: b.Timeout.Knob,
		Traceparent: t.spans.beginTool(step, callID, c.Name, kind, b.Enforcement, start)})
	act := &activity{step: step, subject: toolSubject(c.Name), callID: callID, tool: c.Name, deadline: deadline, limit: b.Timeout.D,
		advisory: b.Enforcement == budget.Advisory}
	t.live.begin(act)

	call := &tool.Call{ID: callID, TurnID: t.s.TurnID, Tool: c.Name, Input: args, MaxOutput: t.s.Limits.MaxToolOutput.N,
		TraceParent: t.spans.traceparent(callID)}
	x := tool.Run(ctx, e.Tool.Tool, call, b, tool.Hooks{
		// Every report keeps the turn alive; the coalesced ones become
		// events (tool.Hooks).
		OnAlive: func() {
			t.live.alive(act)
			for _, rs := range t.reporters {
				rs.Reported(callID)
			}
		},
		OnProgress: func(r tool.Report) {
			t.em.Emit(&event.ToolProgress{CallID: callID, Tool: c.Name, Progress: r.Progress, Total: r.Total, Message: r.Message})
		},
		OnLate: func(res *tool.Result, err error, ended time.Time) { t.late(callID, res, err, ended) },
	})
	t.live.end(act, true)

	result := tool.ModelResult(c.Name, b, x)
	if t.a.timeNotes && !t.noModel {
		result = tool.TimedResult(c.Name, b, x)
	}
	rec := tool.CallRecord(callID, c.Name, string(e.Tool.Tool.Kind()), args, b, x, result)
	rec.TurnID, rec.Step = t.s.TurnID, step
	applyApproval(&rec, approved)
	if earlier != nil {
		rec.Runs, rec.FirstStartedAt = earlier.Runs+1, earlier.First
		rec.ProgressCount += earlier.Reports
	}
	rec = t.addToolRecord(rec)
	t.em.Emit(&event.ToolFinished{ToolCall: rec})
	return result
}

type lateResult struct {
	res   *tool.Result
	err   error
	ended time.Time
}

// late records what an abandoned call returned after it was abandoned.
func (t *turn) late(callID string, res *tool.Result, err error, ended time.Time) {
	t.mu.Lock()
	for i := range t.toolRecs {
		if t.toolRecs[i].CallID == callID {
			t.applyLate(&t.toolRecs[i], lateResult{res, err, ended})
			after := t.ended
			cp := t.toolRecs[i]
			t.mu.Unlock()
			if after {
				for _, s := range t.sinks {
					if ls, ok := s.(event.LateSink); ok {
						ls.LateResult(cp)
					}
				}
			}
			return
		}
	}
	defer t.mu.Unlock()
	// The call's record is written just after tool.Run returns; this
	// result beat it there.
	if t.pendingLate == nil {
		t.pendingLate = map[string]lateResult{}
	}
	t.pendingLate[callID] = lateResult{res, err, ended}
}

// addToolRecord stores a tool call record, with any late result that
// arrived before it.
func (t *turn) addToolRecord(rec event.ToolCall) event.ToolCall {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.toolRecs = append(t.toolRecs, rec)
	r := &t.toolRecs[len(t.toolRecs)-1]
	if lr, ok := t.pendingLate[rec.CallID]; ok {
		delete(t.pendingLate, rec.CallID)
		out := *r
		t.applyLate(r, lr)
		return out // tool_finished carries the record as it was at the end
	}
	return *r
}

// applyLate updates rec with a late result and, while the turn runs,
// reports it as a late_result event. After the turn ended the caller passes
// the record to the run's event.LateSinks. t.mu is held.
func (t *turn) applyLate(rec *event.ToolCall, lr lateResult) {
	var out string
	if lr.res != nil {
		out = strings.ToValidUTF8(string(lr.res.Output), "\uFFFD")
	}
	rec.LateResult, rec.LateOutput = true, out
	if t.ended {
		return
	}
	ev := &event.LateResult{CallID: rec.CallID, Tool: rec.Tool, DurationMS: lr.ended.Sub(rec.StartedAt).Milliseconds(), Output: out}
	if lr.err != nil {
		ev.Error = lr.err.Error()
	}
	t.em.Emit(ev)
}

// CallTool runs one call of the named tool under its budget, outside any
// turn, and returns its record: the `timebox tool call` command. Events
// (tool_started, tool_progress, tool_finished) go to sinks. Cancelling ctx
// stops the call as a cancelled turn would. Its result is the tool's,
// without the time note a model is given (context.time_notes): the
// record's duration and budget say the same.
func (a *Agent) CallTool(ctx context.Context, name string, input json.RawMessage, sinks ...event.Sink) event.ToolCall {
	s := &machine.State{TurnID: "tool-call", Start: time.Now(), Budgets: a.budgets, Limits: a.limits}
	t := a.resume(s, &memTranscript{}, nil, sinks)
	t.noModel = true
	t.live = newLiveness(budget.Duration{}, s.Budgets.ProgressNotice.D, time.Time{}, func(v event.Payload) { t.em.Emit(v) }, func(*budget.TimeoutError) {})
	defer t.live.close()
	t.runTool(ctx, 1, "call_1_1", model.ToolCall{ID: "call_1_1", Name: name, Arguments: string(input)}, nil, nil)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ended = true
	t.em.Close()
	return t.toolRecs[0]
}
