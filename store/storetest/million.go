package storetest

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
)

// TurnModelCall is a model call record with the turn it belongs to.
type TurnModelCall struct {
	// TurnID names the turn the call belongs to.
	TurnID string
	event.ModelCall
}

// GenerateCalls makes n tool call records and n model call records, ten
// tool calls and ten model calls to a turn, started evenly over the span
// before end, and hands them to store in chunks of at most chunk calls of
// each kind, for the stores' benchmarks of `timebox stats` at a million
// calls. They are the same every time: eight tools whose durations are
// log-normal around their own medians (20ms to 20s), 1% of calls timed
// out, 0.5% cancelled, 5% reporting progress; two model endpoints, 1% of
// attempts failing over, one in fifty a compaction.
func GenerateCalls(n, chunk int, end time.Time, span time.Duration, store func([]event.ToolCall, []TurnModelCall) error) error {
	r := rand.New(rand.NewPCG(1, 2))
	tools := []struct {
		name   string
		median float64 // ms
		budget int64   // ms
	}{
		{"word_count", 20, 5000}, {"read_file", 40, 5000}, {"search", 300, 10000}, {"web_fetch", 800, 30000},
		{"sql", 150, 10000}, {"shell", 1500, 60000}, {"crawl", 8000, 600000}, {"build", 20000, 600000},
	}
	step := span / time.Duration(max(n, 1))
	at := end.Add(-span)
	var tcs []event.ToolCall
	var mcs []TurnModelCall
	for i := range n {
		at = at.Add(step)
		turn := fmt.Sprintf("t_bench_%07d", i/10)
		t := tools[r.IntN(len(tools))]
		d := int64(t.median * math.Exp(r.NormFloat64()*0.6))
		tc := event.ToolCall{CallID: fmt.Sprintf("call_%d", i%10), TurnID: turn, Step: i % 10, Tool: t.name, Kind: "exec",
			Arguments: json.RawMessage(`{"q":"a typical argument"}`), StartedAt: at, DurationMS: d, TimeoutMS: t.budget,
			TimeoutSource: budget.SourceTool, Enforcement: budget.Hard, Outcome: event.OutcomeOK, Result: `{"ok": true, "bytes": 1234}`}
		switch x := r.IntN(1000); {
		case x < 10:
			tc.Outcome, tc.Phase, tc.DurationMS = event.OutcomeTimedOut, budget.PhaseTool, t.budget+3
		case x < 15:
			tc.Outcome, tc.Phase = event.OutcomeCancelled, budget.PhaseCancel
		case x < 65:
			tc.ProgressCount = 1 + r.IntN(20)
		}
		tc.EndedAt = at.Add(time.Duration(tc.DurationMS) * time.Millisecond)
		tcs = append(tcs, tc)

		mc := event.ModelCall{Step: i%10 + 1, Model: "gpt-4o-mini", Provider: "openai", Profile: "OPENAI_API_KEY", Attempt: 1,
			StartedAt: at, FirstChunkMS: int64(400 * math.Exp(r.NormFloat64()*0.5)), Outcome: event.OutcomeOK}
		if i%3 == 0 {
			mc.Model, mc.Provider, mc.Profile = "claude-haiku", "anthropic", "ANTHROPIC_API_KEY"
		}
		mc.StreamMS = mc.FirstChunkMS + int64(r.IntN(3000))
		switch x := r.IntN(100); {
		case x < 1:
			mc.Outcome, mc.Phase, mc.FirstChunkMS, mc.StreamMS = event.OutcomeTimedOut, budget.PhaseLLMFirstChunk, 0, 60000
		case x < 3:
			mc.Compaction = true
		}
		mcs = append(mcs, TurnModelCall{turn, mc})
		if len(tcs) == chunk || i == n-1 {
			if err := store(tcs, mcs); err != nil {
				return err
			}
			tcs, mcs = tcs[:0], mcs[:0]
		}
	}
	return nil
}
