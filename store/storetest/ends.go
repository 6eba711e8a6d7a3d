package storetest

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/store"
)

// EndsAtOnce is what EndAtOnce measured: how long after the instant the
// ends returned, in order.
type EndsAtOnce struct {
	// Returned holds how long after the instant each end returned,
	// shortest first.
	Returned []time.Duration
}

// Quantile is when the q-th of the ends had returned (0 ≤ q ≤ 1).
func (e EndsAtOnce) Quantile(q float64) time.Duration {
	return e.Returned[int(q*float64(len(e.Returned)-1))]
}

// BenchmarkTurnEnds runs EndAtOnce in s, b.N rounds of TB_BENCH_TURNS
// turns (10,000), and reports when the ends returned after their instant:
// p50, p99 and the last (ends-p50-ms, ends-p99-ms, ends-last-ms, over all
// rounds), and the last over the turns (ends-µs/turn: what a turn's end
// costs the store when they all come at once).
func BenchmarkTurnEnds(b *testing.B, s store.Store) {
	n := 10000
	if v := os.Getenv("TB_BENCH_TURNS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			b.Fatalf("TB_BENCH_TURNS=%q: want a count of turns", v)
		}
	}
	var all EndsAtOnce
	var last time.Duration
	round := 0
	for b.Loop() {
		round++
		e := EndAtOnce(b, s, n, strconv.Itoa(round))
		all.Returned = append(all.Returned, e.Returned...)
		last += e.Quantile(1)
	}
	slices.Sort(all.Returned)
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	b.ReportMetric(ms(all.Quantile(0.5)), "ends-p50-ms")
	b.ReportMetric(ms(all.Quantile(0.99)), "ends-p99-ms")
	b.ReportMetric(ms(all.Quantile(1)), "ends-last-ms")
	b.ReportMetric(float64(last.Microseconds())/float64(round*n), "ends-µs/turn")
	b.ReportMetric(0, "ns/op")
}

// EndAtOnce begins n turns in s the way the server does (a store.Recorder
// each), each in its own session with a model call and a tool call under
// way, then ends all of them at one instant, as turns whose ceilings fall
// together do: each on its own goroutine emits its call's tool_finished
// (cancelled) and its turn_finished (turn_timeout) and stores its end
// (Recorder.Finish). It returns how long after the instant each end
// returned, and checks that every turn's end is stored whole. round names
// the turns apart from another round's in the same store.
func EndAtOnce(tb testing.TB, s store.Store, n int, round string) EndsAtOnce {
	tb.Helper()
	ctx := context.Background()
	start := time.Now()
	type live struct {
		id  string
		em  *event.Emitter
		rec *store.Recorder
	}
	turns := make([]live, n)
	for i := range turns {
		id := "end-" + round + "-" + strconv.Itoa(i)
		l := live{id: id, rec: store.NewRecorder(s)}
		l.em = event.NewEmitter(id, l.rec)
		if err := l.rec.Begin(ctx, store.TurnStart{TurnID: id, SessionID: "s-" + id, Agent: "bench", Input: "hi", StartedAt: start}); err != nil {
			tb.Fatal(err)
		}
		l.em.Emit(&event.TurnStarted{SessionID: "s-" + id, Agent: "bench", Input: "hi", Model: "script:m"})
		l.em.Emit(&event.LLMStarted{Step: 1, Model: "m", Provider: "script", Attempt: 1})
		l.em.Emit(&event.LLMDelta{Step: 1, Text: "Let me check."})
		l.em.Emit(&event.LLMFinished{ModelCall: event.ModelCall{Step: 1, Model: "m", Provider: "script", Attempt: 1,
			StartedAt: start, Outcome: event.OutcomeOK}})
		l.em.Emit(&event.ToolStarted{Step: 1, CallID: "call_1", Tool: "wait", Kind: "go", TimeoutMS: 3600000})
		turns[i] = l
	}
	if err := s.Flush(ctx); err != nil {
		tb.Fatal(err)
	}
	returned := make([]time.Duration, n)
	var wg sync.WaitGroup
	instant := time.Now()
	for i, l := range turns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			end := time.Now()
			mc := event.ModelCall{Step: 1, Model: "m", Provider: "script", Attempt: 1, StartedAt: start, Outcome: event.OutcomeOK}
			tc := event.ToolCall{CallID: "call_1", TurnID: l.id, Step: 1, Tool: "wait", Kind: "go", Arguments: json.RawMessage(`{"q":"x"}`),
				StartedAt: start, EndedAt: end, DurationMS: end.Sub(start).Milliseconds(), TimeoutMS: 3600000,
				Outcome: event.OutcomeCancelled, Phase: budget.PhaseTurn, Result: `{"error": "stopped by the turn's budget"}`}
			l.em.Emit(&event.ToolFinished{ToolCall: tc})
			rec := &event.Turn{TurnID: l.id, SessionID: "s-" + l.id, Agent: "bench", Input: "hi", Status: budget.TurnTimeout.Status(),
				StopReason: budget.TurnTimeout, Message: "The turn's budget ran out while tool wait was running.", StartedAt: start, EndedAt: end,
				Steps: 1, WallMS: end.Sub(start).Milliseconds(), ToolCalls: []event.ToolCall{tc}, ModelCalls: []event.ModelCall{mc}}
			l.em.Emit(&event.TurnFinished{Status: rec.Status, StopReason: rec.StopReason, Message: rec.Message, Totals: rec.Totals()})
			l.em.Close()
			rec.Events = l.em.Log()
			msgs := []model.Message{{Role: model.RoleUser, Content: "hi"}, {Role: model.RoleAssistant, Content: "Let me check."},
				{Role: model.RoleTool, Content: tc.Result, ToolCallID: tc.CallID}}
			if err := l.rec.Finish(ctx, rec, msgs); err != nil {
				tb.Error(err)
			}
			returned[i] = time.Since(instant)
		}()
	}
	wg.Wait()
	for _, l := range []live{turns[0], turns[n-1]} {
		got, err := s.Turn(ctx, l.id)
		if err != nil {
			tb.Fatal(err)
		}
		if got.StopReason != budget.TurnTimeout || len(got.ToolCalls) != 1 || got.ToolCalls[0].Outcome != event.OutcomeCancelled {
			tb.Fatalf("turn %s stored as %s with %d calls, want turn_timeout with its cancelled call", l.id, got.StopReason, len(got.ToolCalls))
		}
	}
	slices.Sort(returned)
	return EndsAtOnce{Returned: returned}
}
