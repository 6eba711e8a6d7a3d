package temporal

import (
	"context"
	"testing"
	"time"
	"unsafe"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
)

// TestResultTakesResultsFromEvents: the runner's result reads the record
// without its calls' results and takes each from its tool_finished, the
// copy the events hold (issue 29); a record that no followed event
// carried is read whole.
func TestResultTakesResultsFromEvents(t *testing.T) {
	ctx := context.Background()
	start := time.Date(2026, 11, 27, 10, 0, 0, 0, time.UTC)
	m := store.NewMemory()
	rec := store.NewRecorder(m)
	if err := rec.Begin(ctx, store.TurnStart{TurnID: "t1", StartedAt: start}); err != nil {
		t.Fatal(err)
	}
	em := event.NewEmitter("t1", rec)
	var calls []event.ToolCall
	for _, id := range []string{"c1", "c2"} {
		tc := event.ToolCall{CallID: id, Tool: "big", Outcome: event.OutcomeOK, Result: "the result of " + id, StartedAt: start}
		calls = append(calls, tc)
		em.Emit(&event.ToolFinished{ToolCall: tc})
	}
	em.Emit(&event.TurnFinished{Status: budget.StatusCompleted, StopReason: budget.Answered})
	em.Close()
	log := em.Log()
	end := &event.Turn{TurnID: "t1", Status: budget.StatusCompleted, StopReason: budget.Answered, ToolCalls: calls, Events: log}
	if err := rec.Finish(ctx, end, nil); err != nil {
		t.Fatal(err)
	}
	r := &Runner{store: m, payloads: m}
	resultOf := func(events []event.Event) map[string]string {
		t.Helper()
		f := &follow{r: r, in: agent.Input{TurnID: "t1"}, events: events}
		if !f.recorded(ctx) {
			t.Fatal("the turn is not recorded")
		}
		res := f.result(ctx)
		if res.Record.Status != budget.StatusCompleted {
			t.Fatalf("result: %s %s", res.Record.Status, res.Record.Message)
		}
		out := map[string]string{}
		for _, tc := range res.Record.ToolCalls {
			out[tc.CallID] = tc.Result
		}
		return out
	}

	got := resultOf(log)
	for i, id := range []string{"c1", "c2"} {
		held := log[i].Data.(*event.ToolFinished).Result
		if got[id] != held || unsafe.StringData(got[id]) != unsafe.StringData(held) {
			t.Errorf("%s: the record's result %q is not its tool_finished's copy", id, got[id])
		}
	}
	// c2's tool_finished was not followed: the record is read whole.
	got = resultOf([]event.Event{log[0], log[2]})
	if got["c1"] != "the result of c1" || got["c2"] != "the result of c2" {
		t.Errorf("results %q", got)
	}
}
