package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"unsafe"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/storetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMemory(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return store.NewMemory() })
}

func TestRecorderKeepsTheFirstError(t *testing.T) {
	s := store.NewMemory()
	r := store.NewRecorder(s)
	// No Begin: every append fails, and the turn is not told.
	em := event.NewEmitter("t1", r)
	em.Emit(&event.LLMDelta{Text: "a"})
	em.Emit(&event.LLMDelta{Text: "b"})
	err := r.Err()
	if !errors.Is(err, store.ErrNotFound) || !strings.Contains(err.Error(), "event 1 (llm_delta) of turn t1") ||
		!strings.Contains(err.Error(), "1 more") {
		t.Fatalf("Err() = %v", err)
	}
	if err := r.Begin(context.Background(), store.TurnStart{TurnID: "t1"}); err != nil {
		t.Fatal(err)
	}
	if err := r.Begin(context.Background(), store.TurnStart{TurnID: "t1"}); !errors.Is(err, store.ErrExists) {
		t.Fatalf("second Begin: %v", err)
	}
}

// TestRecorderFinishMakesGoodFailedEvents: events whose writes failed
// as the turn ran are stored by its end, and are no longer its error.
func TestRecorderFinishMakesGoodFailedEvents(t *testing.T) {
	s := store.NewMemory()
	r := store.NewRecorder(s)
	em := event.NewEmitter("t1", r)
	em.Emit(&event.LLMDelta{Text: "a"}) // no turn yet: fails
	if err := r.Begin(context.Background(), store.TurnStart{TurnID: "t1"}); err != nil {
		t.Fatal(err)
	}
	em.Emit(&event.LLMDelta{Text: "b"})
	em.Emit(&event.TurnFinished{Status: budget.StatusCompleted, StopReason: budget.Answered})
	em.Close()
	if r.Err() == nil {
		t.Fatal("the first event's write did not fail")
	}
	rec := &event.Turn{TurnID: "t1", Status: budget.StatusCompleted, StopReason: budget.Answered, Events: em.Log()}
	if err := r.Finish(context.Background(), rec, nil); err != nil {
		t.Fatalf("Finish = %v, want nil: the end stored the event that failed", err)
	}
	if n, err := r.MadeGood(); n != 1 || !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("MadeGood = %d, %v; want 1, the failed write's error", n, err)
	}
	evs, err := s.Events(context.Background(), "t1", 0, 0)
	if err != nil || len(evs) != 3 || evs[0].Seq != 1 {
		t.Fatalf("%d events stored, %v", len(evs), err)
	}
}

func TestShortInput(t *testing.T) {
	if got := store.ShortInput("héllo"); got != "héllo" {
		t.Fatal(got)
	}
	long := strings.Repeat("é", store.SummaryInputRunes+10)
	got := []rune(store.ShortInput(long))
	if len(got) != store.SummaryInputRunes || got[len(got)-1] != '…' {
		t.Fatalf("%d runes", len(got))
	}
	if store.ClampLimit(0) != store.DefaultLimit || store.ClampLimit(1e6) != store.MaxLimit || store.ClampLimit(7) != 7 {
		t.Fatal("ClampLimit")
	}
}

// TestMemoryNumbersEvents: an event appended with seq 0 gets its turn's
// next seq (Store.AppendEvent).
func TestMemoryNumbersEvents(t *testing.T) {
	m := store.NewMemory()
	ctx := context.Background()
	if err := m.BeginTurn(ctx, store.TurnStart{TurnID: "t1", Input: "go", Engine: "test"}); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := m.AppendEvent(ctx, event.Event{TurnID: "t1", Type: event.TypeStillWorking, Data: &event.StillWorking{}}); err != nil {
			t.Fatal(err)
		}
	}
	evs, err := m.Events(ctx, "t1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for _, e := range evs {
		seqs = append(seqs, e.Seq)
	}
	if len(seqs) != 3 || seqs[0] != 1 || seqs[1] != 2 || seqs[2] != 3 {
		t.Fatalf("seqs %v, want [1 2 3]", seqs)
	}
}

// queued is a store whose queue never commits: what it was handed.
type queued struct {
	store.Store
	cbs []func(error)
}

func (q *queued) QueueEvent(_ event.Event, committed func(error)) { q.cbs = append(q.cbs, committed) }

// TestEnqueueRefusedDoesNotWait: the record of a call refused before it ran
// is queued, not waited for (a reply asking for 10,000 calls past
// max_tool_calls would wait for 10,000 commits); that of a call that ran
// is waited for.
func TestEnqueueRefusedDoesNotWait(t *testing.T) {
	q := &queued{Store: store.NewMemory()}
	store.Enqueue(q, event.Event{Type: event.TypeToolFinished, Data: &event.ToolFinished{ToolCall: event.ToolCall{CallID: "c1", Refused: "limit"}}}, nil)
	store.Enqueue(q, event.Event{Type: event.TypeToolFinished, Data: &event.ToolFinished{ToolCall: event.ToolCall{CallID: "c2"}}}, nil)
	if len(q.cbs) != 2 || q.cbs[0] != nil || q.cbs[1] == nil {
		t.Fatalf("callbacks %v: want the refused call's queued as given (nil), the run call's waited for", q.cbs)
	}
}

// TestMemoryKeepsTheRecordsDeltas: FinishTurn keeps the record's deltas
// (pieces of the joined reply) in place of the stored ones of the same
// seq and text; a delta whose text differs stays as stored.
func TestMemoryKeepsTheRecordsDeltas(t *testing.T) {
	m := store.NewMemory()
	ctx := context.Background()
	if err := m.BeginTurn(ctx, store.TurnStart{TurnID: "t1", Input: "go"}); err != nil {
		t.Fatal(err)
	}
	texts := []string{"ab", "cd", "ef"}
	var rec []event.Event
	for i, s := range texts {
		e := event.Event{Seq: int64(i + 1), TurnID: "t1", Type: event.TypeLLMDelta, Data: &event.LLMDelta{Step: 1, Text: s}}
		if err := m.AppendEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
		if i == 1 {
			s = "XX" // not the stored text: the stored one stays
		}
		e.Data = &event.LLMDelta{Step: 1, Text: s}
		rec = append(rec, e)
	}
	if err := m.FinishTurn(ctx, &event.Turn{TurnID: "t1", Events: rec}, nil); err != nil {
		t.Fatal(err)
	}
	evs, err := m.Events(ctx, "t1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range evs {
		d := e.Data.(*event.LLMDelta)
		if d.Text != texts[i] || (d == rec[i].Data) == (i == 1) {
			t.Errorf("event %d: %q, the record's %v", e.Seq, d.Text, d == rec[i].Data)
		}
	}
}

// TestMemoryLetsChunksGoOnceJoined: through a Recorder, the memory store
// keeps a joined reply's deltas in place of the chunks it was given as
// soon as the reply is joined, not at the turn's end, so that a long
// reply's chunks are let go while the turn goes on (issue 29).
func TestMemoryLetsChunksGoOnceJoined(t *testing.T) {
	ctx := context.Background()
	s := store.NewMemory()
	r := store.NewRecorder(s)
	if err := r.Begin(ctx, store.TurnStart{TurnID: "t1"}); err != nil {
		t.Fatal(err)
	}
	em := event.NewEmitter("t1", r)
	start := em.Emit(&event.LLMStarted{Step: 1})
	em.Emit(&event.LLMDelta{Step: 1, Text: strings.Clone("ab")})
	em.Emit(&event.LLMDelta{Step: 1, Text: strings.Clone("cd")})
	reply := strings.Clone("abcd")
	em.ShareReply(start.Seq, 1, reply)
	events, err := s.Events(ctx, "t1", 0, 0)
	if err != nil || len(events) != 3 {
		t.Fatalf("%d events, %v", len(events), err)
	}
	for i, e := range events[1:] {
		d := e.Data.(*event.LLMDelta)
		if unsafe.StringData(d.Text) != unsafe.StringData(reply[2*i:]) {
			t.Errorf("stored delta %d (%q) is still its own chunk, not a piece of the joined reply", e.Seq, d.Text)
		}
	}
}
