package storetest

import (
	"context"
	"testing"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
)

// dropping is a turn's sink that loses one of its events, as a group the
// queue failed to store (a full disk) loses its events while later ones
// are stored.
type dropping struct {
	event.Sink
	seq int64
}

// Emit passes e on unless it is the event of seq.
func (d dropping) Emit(e event.Event) {
	if e.Seq != d.seq {
		d.Sink.Emit(e)
	}
}

// testEndWrites checks that a turn's end writes what the queue did not
// store, and what changed after it was stored (store.EndOf): an event
// lost before a later one was stored, with the call record it carried; a
// record a late result changed after its tool_finished; a model call's
// record changed after its llm_finished.
func testEndWrites(t *testing.T, s store.Store) {
	ctx := context.Background()

	// turn_started 1; llm_started 2, llm_delta 3, llm_finished 4;
	// call_1_1 5, 6; call_1_2 7, 8 (lost); call_1_3 9, 10; turn_finished 11.
	const lost = 8
	tr := beginThrough(t, s, "t1", "", "x", func(to event.Sink) event.Sink { return dropping{to, lost} })
	tr.model(1, "calling")
	for n := 1; n <= 3; n++ {
		tr.tool(1, n, event.OutcomeOK)
	}
	tr.finish(t, budget.Answered)
	evs, err := s.Events(ctx, "t1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for _, e := range evs {
		seqs = append(seqs, e.Seq)
	}
	if len(evs) != 11 || evs[lost-1].Seq != lost || evs[lost-1].Type != event.TypeToolFinished {
		t.Fatalf("the end did not store the event the queue lost (seq %d): seqs %v", lost, seqs)
	}
	got, err := s.Turn(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.ToolCalls) != 3 || got.ToolCalls[1].CallID != "call_1_2" || got.ToolCalls[1].Result != "rcall_1_2" {
		t.Fatalf("the lost event's call record: %+v", got.ToolCalls)
	}

	// Every event stored; a late result and a model call's tokens change
	// their records after their events.
	tr = begin(t, s, "t2", "", "y")
	tr.model(1, "calling")
	tr.tool(1, 1, event.OutcomeOK)
	tr.tool(1, 2, event.OutcomeAbandoned)
	tr.model(2, "done")
	tr.tools[1].LateResult, tr.tools[1].LateOutput = true, "finally"
	tr.models[1].OutputTokens = 7
	tr.finish(t, budget.Answered)
	got, err = s.Turn(ctx, "t2")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.ToolCalls) != 2 || got.ToolCalls[0].LateResult || !got.ToolCalls[1].LateResult || got.ToolCalls[1].LateOutput != "finally" {
		t.Fatalf("the late result the end knew of was not stored: %+v", got.ToolCalls)
	}
	if len(got.ModelCalls) != 2 || got.ModelCalls[0].OutputTokens != 0 || got.ModelCalls[1].OutputTokens != 7 {
		t.Fatalf("model calls: %+v", got.ModelCalls)
	}

	// Nothing changed: the records are as the events stored them, once.
	tr = begin(t, s, "t3", "", "z")
	tr.model(1, "calling")
	tr.tool(1, 1, event.OutcomeOK)
	tr.model(2, "done")
	tr.finish(t, budget.Answered)
	got, err = s.Turn(ctx, "t3")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.ToolCalls) != 1 || got.ToolCalls[0].Result != "rcall_1_1" || len(got.ModelCalls) != 2 || got.ModelCalls[1].Step != 2 {
		t.Fatalf("records: %+v %+v", got.ToolCalls, got.ModelCalls)
	}
}
