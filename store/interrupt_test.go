package store_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
)

// TestAnInterruptedTurnKeepsItsTimes: a turn whose process died ends
// with the model and tool time its stored events show (lower bounds, as
// its wall time is), not 0ms: the model calls' stream time, the tool
// calls' time with a batch's overlap counted once, the call that was
// running until the last event, and its failovers.
func TestAnInterruptedTurnKeepsItsTimes(t *testing.T) {
	at, ev := timeline()
	call := func(id string, from, to int) *event.ToolFinished {
		return &event.ToolFinished{ToolCall: event.ToolCall{CallID: id, Tool: "sh", StartedAt: at(from), EndedAt: at(to)}}
	}
	refused := call("c9", 900, 900)
	refused.Refused = event.RefusedUnknownTool
	evs := []event.Event{
		ev(0, &event.LLMStarted{Step: 1, Model: "a"}),
		ev(300, &event.LLMFinished{ModelCall: event.ModelCall{Step: 1, StreamMS: 300}}),
		ev(300, &event.Failover{Step: 1, From: "a", To: "b"}),
		ev(300, &event.LLMStarted{Step: 1, Model: "b"}),
		ev(1000, &event.LLMFinished{ModelCall: event.ModelCall{Step: 1, StreamMS: 700}}),
		ev(1000, &event.ToolStarted{Step: 1, CallID: "c1", Tool: "sh"}),
		ev(1000, &event.ToolStarted{Step: 1, CallID: "c2", Tool: "sh"}),
		ev(3000, call("c1", 1000, 3000)),
		ev(4000, call("c2", 2000, 4000)), // overlaps c1: the batch is 3s
		ev(4000, refused),
		ev(4000, &event.LLMStarted{Step: 2, Model: "b"}),
		ev(4500, &event.LLMFinished{ModelCall: event.ModelCall{Step: 2, StreamMS: 500}}),
		ev(4500, &event.ToolStarted{Step: 2, CallID: "c3", Tool: "sh"}),
		ev(6500, &event.ToolProgress{CallID: "c3"}), // the last event: c3 ran at least 2s
	}
	out := store.Interrupt(store.Interrupted{TurnID: "t1", StartedAt: at(0), Events: evs, ToolCalls: 3, Steps: 2, End: store.End{Why: "it died"}, Now: at(9000)})
	r := out.Record
	if r.LLMMS != 1500 || r.ToolMS != 5000 || r.Failovers != 1 || r.WallMS != 6500 {
		t.Errorf("record: llm_ms %d (want 1500), tool_ms %d (want 5000), failovers %d (want 1), wall_ms %d (want 6500)",
			r.LLMMS, r.ToolMS, r.Failovers, r.WallMS)
	}
	fin := out.Events[len(out.Events)-1].Data.(*event.TurnFinished)
	if tot := fin.Totals; tot.LLMMS != r.LLMMS || tot.ToolMS != r.ToolMS || tot.Failovers != r.Failovers {
		t.Errorf("turn_finished's totals %+v differ from the record's", tot)
	}

	// A model call under way counts until the last event.
	_, ev = timeline() // numbered from 1 again
	out = store.Interrupt(store.Interrupted{TurnID: "t1", StartedAt: at(0), Events: []event.Event{
		ev(100, &event.LLMStarted{Step: 1, Model: "a"}), ev(2100, &event.LLMDelta{Step: 1, Text: "hal"}),
	}, End: store.End{Why: "it died"}, Now: at(9000)})
	if out.Record.LLMMS != 2000 || out.Record.ToolMS != 0 {
		t.Errorf("a model call under way: llm_ms %d (want 2000), tool_ms %d", out.Record.LLMMS, out.Record.ToolMS)
	}
}

// TestAnEndedTurnIsNotInterruptedAgain: a turn whose turn_finished was
// stored, but not its record (its store closed before the end's own
// write), ends as its log says, with no second turn_finished.
func TestAnEndedTurnIsNotInterruptedAgain(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	fin := &event.TurnFinished{Status: budget.StatusCompleted, StopReason: budget.Answered, Answer: "slow done", Message: "",
		Totals: event.Totals{Steps: 2, ToolCalls: 1, WallMS: 3500, LLMMS: 20, ToolMS: 3000}}
	evs := []event.Event{
		{Seq: 1, TurnID: "t1", Type: event.TypeLLMStarted, At: t0, Data: &event.LLMStarted{Step: 1, Model: "m"}},
		{Seq: 9, TurnID: "t1", Type: event.TypeTurnFinished, At: t0.Add(3500 * time.Millisecond), Data: fin},
	}
	out := store.Interrupt(store.Interrupted{TurnID: "t1", SessionID: "s", StartedAt: t0, Events: evs, End: store.End{Why: "the store was closed"}, Now: t0.Add(time.Minute)})
	if len(out.Events) != 0 || len(out.Calls) != 0 {
		t.Errorf("%d events and %d calls added to a turn that ended", len(out.Events), len(out.Calls))
	}
	r := out.Record
	if r.Status != budget.StatusCompleted || r.StopReason != budget.Answered || r.Answer != "slow done" || r.WallMS != 3500 ||
		r.ToolMS != 3000 || !r.EndedAt.Equal(t0.Add(3500*time.Millisecond)) || r.SessionID != "s" {
		t.Errorf("record %+v", r)
	}
}

// TestAKnownEndIsSaid: a turn ended by one who knows it ran until now (a
// cancel no worker took: store.End.Said) ends now, its wall time the
// whole of it, and its message opens with what that one says, with how
// long the turn ran, not the "at least … the real end is unknown" of a
// crash, which said 0s of a turn cancelled after a minute of waiting.
func TestAKnownEndIsSaid(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	said := func(ran time.Duration) string { return "Cancelled after " + budget.RoundHuman(ran).String() + "." }
	for _, tc := range []struct {
		name string
		evs  []event.Event
		want string
	}{
		{"nothing ran", nil, "Cancelled after 1m6s. Nothing of it ran. Send the message again to retry."},
		{"a tool was running", []event.Event{
			{Seq: 1, TurnID: "t1", Type: event.TypeToolStarted, At: t0.Add(time.Second), Data: &event.ToolStarted{Step: 1, CallID: "c1", Tool: "sh"}},
		}, "Cancelled after 1m6s. Tool sh was running; its call is recorded as interrupted. Everything it emitted is kept (1 event). Send the message again to retry."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := store.Interrupt(store.Interrupted{TurnID: "t1", StartedAt: t0, Events: tc.evs,
				End: store.End{Why: "it was cancelled", Said: said}, Now: t0.Add(66 * time.Second)})
			r := out.Record
			if r.Message != tc.want {
				t.Errorf("message %q, want %q", r.Message, tc.want)
			}
			if r.WallMS != 66000 || !r.EndedAt.Equal(t0.Add(66*time.Second)) || r.Status != budget.StatusInterrupted {
				t.Errorf("record: %s, wall_ms %d, ended_at %s", r.Status, r.WallMS, r.EndedAt)
			}
			fin := out.Events[len(out.Events)-1].Data.(*event.TurnFinished)
			if fin.Message != r.Message || fin.Totals.WallMS != r.WallMS {
				t.Errorf("turn_finished %+v differs from the record", fin)
			}
		})
	}
}

// TestAStopFromOutside: a turn stopped by a budget from outside its
// process (End.Stop: the ceiling of a turn no worker runs) ends with its
// reason's status, the message, flags and limit Stop gives for the calls
// that were running, those calls recorded interrupted, and its end now.
func TestAStopFromOutside(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	evs := []event.Event{
		{Seq: 1, TurnID: "t1", Type: event.TypeToolStarted, At: t0.Add(time.Second), Data: &event.ToolStarted{Step: 1, CallID: "c1", Tool: "sh"}},
	}
	var got []event.ToolCall
	limit := &event.BudgetValue{Key: budget.KeyTurn, Value: "1m"}
	out := store.Interrupt(store.Interrupted{TurnID: "t1", StartedAt: t0, Events: evs, Now: t0.Add(66 * time.Second),
		End: store.End{Reason: budget.TurnTimeout, Why: "no worker ran it", Stop: func(running []event.ToolCall) store.Stopped {
			got = running
			return store.Stopped{Message: "Stopped after 1m0s.", Flags: event.Flags{TimedOutByTurnBudget: true, TimedOutDuringToolExecution: true}, Limit: limit}
		}}})
	r := out.Record
	if len(got) != 1 || got[0].Tool != "sh" || !got[0].StartedAt.Equal(t0.Add(time.Second)) || len(out.Calls) != 1 ||
		out.Calls[0].Outcome != event.OutcomeInterrupted {
		t.Errorf("running calls given %+v, recorded %+v", got, out.Calls)
	}
	if want := "Stopped after 1m0s. Tool sh was running; its call is recorded as interrupted."; r.Message != want {
		t.Errorf("message %q, want %q", r.Message, want)
	}
	if r.Status != budget.StatusStopped || r.StopReason != budget.TurnTimeout || !r.Flags.TimedOutDuringToolExecution ||
		r.WallMS != 66000 || !r.EndedAt.Equal(t0.Add(66*time.Second)) {
		t.Errorf("record: %s (%s), flags %+v, wall_ms %d", r.Status, r.StopReason, r.Flags, r.WallMS)
	}
	fin := out.Events[len(out.Events)-1].Data.(*event.TurnFinished)
	if fin.Status != r.Status || fin.Message != r.Message || fin.Flags != r.Flags || fin.Limit != limit {
		t.Errorf("turn_finished %+v differs from the record", fin)
	}
}

// TestTheModelCallUnderWay: the end of a turn whose process died tells
// of the model call that was under way (Interruption.Attempt), whose
// span died with it: a model attempt (its llm_started), or a compaction
// (its compaction_started, which names its span's ids as llm_started
// does), from its start to the turn's last stored event; none once it
// finished.
func TestTheModelCallUnderWay(t *testing.T) {
	at, ev := timeline()
	attempt := &event.LLMStarted{Step: 1, Model: "a", Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	compaction := &event.CompactionStarted{Step: 2, Attempt: 1, Model: "a", Traceparent: "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"}
	finished := &event.LLMFinished{ModelCall: event.ModelCall{Step: 1, StreamMS: 500}}
	for _, c := range []struct {
		name string
		evs  []event.Event
		want *event.LostAttempt
	}{
		{"attempt", []event.Event{ev(100, attempt), ev(600, &event.LLMDelta{Step: 1, Text: "hal"})},
			&event.LostAttempt{Started: attempt, At: at(100), Until: at(600)}},
		{"compaction", []event.Event{ev(100, attempt), ev(600, finished), ev(700, compaction), ev(1900, &event.StillWorking{Step: 2})},
			&event.LostAttempt{Compaction: compaction, At: at(700), Until: at(1900)}},
		{"compaction finished", []event.Event{ev(700, compaction), ev(900, &event.CompactionFinished{Step: 2}),
			ev(1000, &event.ToolStarted{Step: 2, CallID: "c1", Tool: "sh"})}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			out := store.Interrupt(store.Interrupted{TurnID: "t1", StartedAt: at(0), Events: c.evs, End: store.End{Why: "it died"}, Now: at(9000)})
			if !reflect.DeepEqual(out.Attempt, c.want) {
				t.Errorf("the model call under way: %+v; want %+v", out.Attempt, c.want)
			}
		})
	}
}

// timeline returns, for a test's turn t1, the time ms milliseconds into
// it, and its next event (numbered in order) of payload d at ms.
func timeline() (at func(ms int) time.Time, ev func(ms int, d event.Payload) event.Event) {
	t0 := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	at = func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var seq int64
	ev = func(ms int, d event.Payload) event.Event {
		seq++
		return event.Event{Seq: seq, TurnID: "t1", Type: d.Type(), At: at(ms), Data: d}
	}
	return at, ev
}
