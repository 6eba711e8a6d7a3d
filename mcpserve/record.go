package mcpserve

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/tool"
)

// Progress is one progress report of a call, as it was sent upstream
// (coalesced as a turn's tool_progress events are), with when it came.
type Progress struct {
	// At is when the report came.
	At time.Time
	tool.Report
}

// Record returns the call's tool call record, as a turn's record lists
// the same call run by the model (spec §8), in turn turnID. Step is 0: no
// model asked for it.
func (f *Finished) Record(turnID string) event.ToolCall {
	rec := tool.CallRecord(f.CallID, f.Tool, f.Kind, f.Arguments, f.Budget, f.Execution, f.Result)
	rec.TurnID = turnID
	return rec
}

// Turn returns the call as the store keeps it (docs/decisions/mcp-server-records.md):
// a turn of its own, in the session of the client's connection, whose
// input is the request, whose answer is what the client was answered,
// and whose events are the call's — turn_started, tool_started, its
// tool_progress, tool_finished, turn_finished — so that `timebox runs`,
// the page, `timebox stats` and the fault suite read it as any other
// turn's call. agentName names the agent file's agent.
//
// The turn ends completed (answered) whenever the client was answered a
// result, whatever the call's outcome: a timeout or a tool error is an
// answer to the request, and the call's record says how the tool ended.
// A call the client cancelled, whose client went away, or that a shutdown
// stopped ends the turn cancelled with that stop reason.
func (f *Finished) Turn(agentName string) *event.Turn {
	x := f.Execution
	id := agent.NewTurnID()
	rec := f.Record(id)
	t := &event.Turn{TurnID: id, SessionID: f.SessionID, Agent: agentName, Input: f.Input(),
		StartedAt: x.Started, EndedAt: x.Ended, ToolMS: rec.DurationMS, WallMS: rec.DurationMS,
		Status: budget.StatusCompleted, StopReason: budget.Answered, Answer: f.Result,
		ToolCalls: []event.ToolCall{rec}}
	t.Message = fmt.Sprintf("Answered the MCP client's call of %s after %s: %s.", f.Tool, x.Elapsed().Round(time.Millisecond), outcomeWords(rec))
	if rec.Outcome == event.OutcomeCancelled {
		t.Status, t.StopReason = budget.StatusCancelled, budget.Cancelled
		by := "the MCP client"
		var ce *budget.CancelError
		if errors.As(x.Cause, &ce) {
			t.StopReason, by = ce.Reason, ce.By
		}
		switch t.StopReason {
		case budget.ClientGone:
			t.Message = fmt.Sprintf("The MCP client went away after %s; tool %s was stopped.", x.Elapsed().Round(time.Millisecond), f.Tool)
		case budget.Shutdown:
			t.Message = fmt.Sprintf("Stopped by %s's shutdown after %s; tool %s was stopped.", strings.TrimPrefix(by, "the "), x.Elapsed().Round(time.Millisecond), f.Tool)
		default:
			t.Message = fmt.Sprintf("Cancelled by %s after %s; tool %s was stopped.", by, x.Elapsed().Round(time.Millisecond), f.Tool)
		}
	}

	var seq int64
	add := func(at time.Time, p event.Payload) {
		seq++
		t.Events = append(t.Events, event.Event{Seq: seq, TurnID: id, Type: p.Type(), At: at.UTC(), Data: p})
	}
	b := f.Budget
	add(x.Started, &event.TurnStarted{SessionID: f.SessionID, Agent: agentName, Input: t.Input,
		Tools: map[string]event.ToolBudgetSummary{f.Tool: {TimeoutMS: b.Timeout.MS(), Source: b.Timeout.Source,
			IdleTimeoutMS: b.IdleTimeout.MS(), Enforcement: b.Enforcement}}})
	var deadline time.Time
	if b.Timeout.D > 0 {
		deadline = x.Started.Add(b.Timeout.D).UTC()
	}
	add(x.Started, &event.ToolStarted{CallID: f.CallID, Tool: f.Tool, Kind: f.Kind, Arguments: f.Arguments,
		TimeoutMS: b.Timeout.MS(), Deadline: deadline, Enforcement: b.Enforcement, Source: b.Timeout.Source,
		IdleTimeoutMS: b.IdleTimeout.MS()})
	for _, p := range f.Progress {
		add(p.At, &event.ToolProgress{CallID: f.CallID, Tool: f.Tool, Progress: p.Progress, Total: p.Total, Message: p.Message})
	}
	add(x.Ended, &event.ToolFinished{ToolCall: rec})
	add(x.Ended, &event.TurnFinished{Status: t.Status, StopReason: t.StopReason, Message: t.Message, Answer: t.Answer,
		Totals: t.Totals()})
	return t
}

// Input is the request as a turn's input shows it: "tools/call NAME
// {arguments}".
func (f *Finished) Input() string {
	args := f.Arguments
	if len(args) == 0 {
		args = json.RawMessage("{}")
	}
	return "tools/call " + f.Tool + " " + string(args)
}

func outcomeWords(rec event.ToolCall) string {
	switch rec.Outcome {
	case event.OutcomeOK:
		if rec.Overran {
			return fmt.Sprintf("ok, past its advisory budget of %s", time.Duration(rec.TimeoutMS)*time.Millisecond)
		}
		return "ok"
	case event.OutcomeTimedOut:
		return fmt.Sprintf("isError tool_timeout (phase %s)", rec.Phase)
	case event.OutcomeAbandoned:
		return "isError, the call abandoned after its timeout"
	}
	return "isError " + string(rec.Outcome)
}
