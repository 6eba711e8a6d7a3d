package storetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/store"
)

// Crash opens a store on a new, empty database. It returns the store and a
// function that makes it stop as a killed process would — nothing marked,
// nothing removed, its heartbeats stopped — and returns another store on
// the same database, which is to mark the first one's running turns
// interrupted: at once, or once its heartbeat window has passed. The other
// store is opened with ended as its Options.Ended.
type Crash func(t *testing.T) (s store.Store, crash func(ended func(store.Ending)) store.Store)

// RunCrash runs the suite of what a crash leaves behind: the crashed
// store's running turn is marked interrupted by the next store, with
// every call record kept and the running call recorded as interrupted,
// and the next store tells its Options.Ended of that end once, with the
// turn's turn_started (its traceparent), its final record, and the running
// call's tool_started (its span's traceparent) and record; and of a turn
// whose model attempt was under way, with that attempt's llm_started (its
// span's traceparent) and the time of its last stored event.
func RunCrash(t *testing.T, open Crash, why string) {
	t.Run("CrashLeavesTheTurnInterrupted", func(t *testing.T) {
		s, crash := open(t)
		n, kept, err := WriteRunningTurn(s, "t1")
		if err != nil {
			t.Fatal(err)
		}
		after, e := crashTold(t, crash, "t1")
		CheckInterrupted(t, after, "t1", n, kept, why)
		rec, err := after.Turn(context.Background(), "t1")
		if err != nil {
			t.Fatal(err)
		}
		if e.Attempt != nil {
			t.Errorf("told of t1's attempt %+v; none was under way", e.Attempt)
		}
		if e.TurnID != "t1" || e.Started == nil || e.Started.Traceparent != runningTraceparent ||
			e.Record.TurnID != "t1" || e.Record.Status != budget.StatusInterrupted || e.Record.Message != rec.Message ||
			!e.Record.StartedAt.Equal(rec.StartedAt) || !e.Record.EndedAt.Equal(rec.EndedAt) {
			t.Errorf("told of %s: started %+v, record %s %q from %s to %s; stored %q from %s to %s", e.TurnID, e.Started,
				e.Record.Status, e.Record.Message, e.Record.StartedAt, e.Record.EndedAt, rec.Message, rec.StartedAt, rec.EndedAt)
		}
		// The call that was running, whose span died with the process:
		// its tool_started (its span's ids) and the record it was given.
		var stored event.ToolCall
		for _, c := range rec.ToolCalls {
			if c.CallID == "call_1_2" {
				stored = c
			}
		}
		if len(e.Calls) != 1 || e.Calls[0].Started == nil || e.Calls[0].Started.Traceparent != runningCallTraceparent ||
			e.Calls[0].Record.CallID != "call_1_2" || e.Calls[0].Record.Outcome != event.OutcomeInterrupted ||
			e.Calls[0].Record.Result != stored.Result || !e.Calls[0].Record.EndedAt.Equal(stored.EndedAt) {
			t.Errorf("told of the calls %+v; want crawl's, its traceparent %s, as stored: %+v", e.Calls, runningCallTraceparent, stored)
		}
	})
	// The model attempt that was under way, whose span died with the
	// process: its llm_started (its span's ids, the model server's
	// traceparent header), from its start to the last stored event.
	t.Run("CrashMidAttemptTellsTheAttempt", func(t *testing.T) {
		s, crash := open(t)
		answering, err := writeAnsweringTurn(t, s, "t2")
		if err != nil {
			t.Fatal(err)
		}
		after, e := crashTold(t, crash, "t2")
		t2, err := after.Turn(context.Background(), "t2")
		if err != nil {
			t.Fatal(err)
		}
		if e.TurnID != "t2" || len(e.Calls) != 0 || e.Attempt == nil || e.Attempt.Started == nil ||
			e.Attempt.Started.Traceparent != answeringTraceparent || e.Attempt.Started.Model != "m" ||
			!e.Attempt.At.Equal(answering.started) || !e.Attempt.Until.Equal(answering.last) ||
			!e.Record.EndedAt.Equal(t2.EndedAt) || !strings.Contains(t2.Message, "Model m was answering") {
			t.Errorf("told of %s: calls %+v, attempt %+v; want the attempt %s from %s to %s (stored: %q until %s)", e.TurnID,
				e.Calls, e.Attempt, answeringTraceparent, answering.started, answering.last, t2.Message, t2.EndedAt)
		}
	})
}

// crashTold crashes the store crash was returned with and returns the
// next store (closed when the test ends), once it has marked turn id
// interrupted and told its Options.Ended of that end, and the one end it
// told of: it fails t when it tells of none, or of more.
func crashTold(t *testing.T, crash func(ended func(store.Ending)) store.Store, id string) (store.Store, store.Ending) {
	t.Helper()
	var (
		mu   sync.Mutex
		told []store.Ending
	)
	after := crash(func(e store.Ending) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, e)
	})
	t.Cleanup(func() { after.Close() })
	WaitInterrupted(t, after, id, 30*time.Second)
	// It is told after the commit that readers saw.
	wait.Until(10*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(told) > 0
	})
	mu.Lock()
	defer mu.Unlock()
	if len(told) != 1 {
		t.Fatalf("Options.Ended told of %d ends; want the one of %s", len(told), id)
	}
	return after, told[0]
}

// answeringTraceparent is the traceparent the llm_started of
// writeAnsweringTurn's attempt names as its chat span.
const answeringTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b8-01"

// answering is when a turn's attempt under way started and when its last
// event was, as stored.
type answering struct{ started, last time.Time }

// writeAnsweringTurn begins turn id and emits what a turn does up to a
// model attempt under way (an llm_started and a delta), and waits until
// they are stored: only call records are waited for by the Recorder.
func writeAnsweringTurn(t *testing.T, s store.Store, id string) (answering, error) {
	rec := store.NewRecorder(s)
	session := "s_" + id
	if err := rec.Begin(context.Background(), store.TurnStart{TurnID: id, SessionID: session, Input: "say it", StartedAt: time.Now()}); err != nil {
		return answering{}, err
	}
	em := event.NewEmitter(id, rec)
	em.Emit(&event.TurnStarted{SessionID: session, Input: "say it", Model: "script:m"})
	em.Emit(&event.LLMStarted{Step: 1, Model: "m", Provider: "script", Attempt: 1, Traceparent: answeringTraceparent})
	em.Emit(&event.LLMDelta{Step: 1, Text: "Well,"})
	var out answering
	wait.For(t, 10*time.Second, "the attempt's events stored", func() bool {
		evs, err := s.Events(context.Background(), id, 0, 0)
		if err != nil || len(evs) < 3 {
			return false
		}
		out = answering{started: evs[1].At, last: evs[2].At}
		return true
	})
	return out, rec.Err()
}

// runningTraceparent is the traceparent WriteRunningTurn's turn_started
// names as the turn's span.
const runningTraceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// runningCallTraceparent is the traceparent the tool_started of
// WriteRunningTurn's running call (crawl) names as its span.
const runningCallTraceparent = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"

// WriteRunningTurn begins turn id (in session "s_"+id) and emits, through a
// Recorder, what a turn does up to a tool call that is still running: a
// model call, a tool call that finished (word_count) and one that runs
// (crawl) and has reported progress five times. It returns how many events
// it emitted and the seq of the last one that carries a call record
// (which the Recorder waits for: a crash cannot lose it).
func WriteRunningTurn(s store.Store, id string) (emitted, lastRecord int, err error) {
	rec := store.NewRecorder(s)
	session := "s_" + id // one turn at a time per session
	if err := rec.Begin(context.Background(), store.TurnStart{TurnID: id, SessionID: session, Input: "crawl it", StartedAt: time.Now()}); err != nil {
		return 0, 0, err
	}
	em := event.NewEmitter(id, rec)
	em.Emit(&event.TurnStarted{SessionID: session, Input: "crawl it", Model: "script:m", Traceparent: runningTraceparent})
	em.Emit(&event.LLMStarted{Step: 1, Model: "m", Provider: "script", Attempt: 1})
	em.Emit(&event.LLMDelta{Step: 1, Text: "Let me crawl."})
	em.Emit(&event.LLMFinished{ModelCall: event.ModelCall{Step: 1, Model: "m", Provider: "script", Attempt: 1, Outcome: event.OutcomeOK}, ToolCalls: 2})
	em.Emit(&event.ToolStarted{Step: 1, CallID: "call_1_1", Tool: "word_count", TimeoutMS: 5000})
	em.Emit(&event.ToolStarted{Step: 1, CallID: "call_1_2", Tool: "crawl", TimeoutMS: 10000, Traceparent: runningCallTraceparent})
	last := em.Emit(&event.ToolFinished{ToolCall: event.ToolCall{CallID: "call_1_1", Step: 1, Tool: "word_count", Outcome: event.OutcomeOK, StartedAt: time.Now()}})
	for i := range 5 {
		p := float64(i)
		em.Emit(&event.ToolProgress{CallID: "call_1_2", Tool: "crawl", Progress: &p})
	}
	return len(em.Log()), int(last.Seq), rec.Err()
}

// WaitInterrupted waits, watching s, until turn id is no longer running,
// for at most d, and returns how long that took.
func WaitInterrupted(t testing.TB, s store.Store, id string, d time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	wake, stop := s.Watch(id)
	defer stop()
	deadline := time.After(d)
	for {
		rec, err := s.Turn(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		if rec.Status != budget.StatusRunning {
			return time.Since(start)
		}
		select {
		case <-wake:
		case <-deadline:
			t.Fatalf("turn %s still running after %s", id, d)
		}
	}
}

// CheckInterrupted checks the record of a turn written by
// WriteRunningTurn that crashed after emitting `emitted` events, of which
// at least the first `kept` were stored: every call record, the events as
// a gap-free prefix, the running call recorded as interrupted, exactly one
// turn_finished, and a message that says why (`why`), what was running and
// how many events were kept.
func CheckInterrupted(t testing.TB, s store.Store, id string, emitted, kept int, why string) {
	t.Helper()
	evs, err := s.Events(context.Background(), id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	// Without the tool_finished of the running call and the turn_finished
	// the recovery adds.
	stored := len(evs) - 2
	if stored < kept || stored > emitted {
		t.Fatalf("%d events stored, want %d to %d (+1 tool_finished, +1 turn_finished)", stored, kept, emitted)
	}
	ctx := context.Background()
	rec, err := s.Turn(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status != budget.StatusInterrupted || rec.StopReason != budget.Interrupted {
		t.Fatalf("status %s, stop reason %s", rec.Status, rec.StopReason)
	}
	for _, want := range []string{why, "Tool crawl was running", "recorded as interrupted", "at least ", fmt.Sprintf("(%d events)", stored)} {
		if !strings.Contains(rec.Message, want) {
			t.Errorf("message %q lacks %q", rec.Message, want)
		}
	}
	if len(rec.ToolCalls) != 2 || len(rec.ModelCalls) != 1 || rec.Steps != 1 {
		t.Fatalf("records kept: %+v %+v", rec.ToolCalls, rec.ModelCalls)
	}
	// The call that was running gets a record saying it was interrupted,
	// from its events.
	progress := 0
	for _, e := range evs {
		if _, ok := e.Data.(*event.ToolProgress); ok {
			progress++
		}
	}
	var crawl event.ToolCall
	for _, tc := range rec.ToolCalls {
		if tc.Tool == "crawl" {
			crawl = tc
		}
	}
	if crawl.CallID != "call_1_2" || crawl.Outcome != event.OutcomeInterrupted || crawl.TimeoutMS != 10000 ||
		crawl.ProgressCount != progress || crawl.StartedAt.IsZero() || crawl.EndedAt.Before(crawl.StartedAt) ||
		!strings.Contains(crawl.Result, "at least") {
		t.Errorf("the running call's record: %+v", crawl)
	}
	if tf, ok := evs[len(evs)-2].Data.(*event.ToolFinished); !ok || tf.CallID != "call_1_2" || tf.Outcome != event.OutcomeInterrupted {
		t.Errorf("the running call's log does not end with tool_finished: %+v", evs[len(evs)-2])
	}
	finished := 0
	for i, e := range evs {
		// The process's own events are numbered 1, 2, ...; the recovery's
		// after store.PublishedAhead more (what the process may have
		// published and not stored).
		want := int64(i + 1)
		if i >= stored {
			want = int64(i+1) + store.PublishedAhead
		}
		if e.Seq != want {
			t.Fatalf("event %d has seq %d, want %d", i, e.Seq, want)
		}
		if e.Type == event.TypeTurnFinished {
			finished++
		}
	}
	tf, ok := evs[len(evs)-1].Data.(*event.TurnFinished)
	if !ok || finished != 1 || tf.Status != budget.StatusInterrupted || tf.Message != rec.Message || tf.Totals.ToolCalls != 2 {
		t.Fatalf("last event %+v (%d turn_finished)", evs[len(evs)-1], finished)
	}
	list, err := s.Turns(ctx, store.Filter{Status: budget.StatusInterrupted})
	if err != nil || len(list) != 1 || list[0].TurnID != id {
		t.Fatalf("interrupted list %+v %v", list, err)
	}
}
