package store_test

import (
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
)

func TestLongestSilence(t *testing.T) {
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	for _, tc := range []struct {
		name    string
		end     time.Time
		reports []time.Time
		want    int64
	}{
		{"no report: the whole call", ms(1500), nil, 1500},
		{"start to the first report", ms(1000), []time.Time{ms(700), ms(900)}, 700},
		{"between two reports, in any order", ms(1000), []time.Time{ms(800), ms(100)}, 700},
		{"last report to the end", ms(1000), []time.Time{ms(100), ms(200)}, 800},
		{"reports outside the call are clamped", ms(1000), []time.Time{ms(-500), ms(600), ms(4000)}, 600},
		{"an end before the start", ms(-10), nil, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := store.LongestSilence(t0, tc.end, tc.reports); got != tc.want {
				t.Errorf("LongestSilence = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestPercentileRank(t *testing.T) {
	for _, tc := range []struct{ pct, n, want int64 }{
		{50, 1, 1}, {99, 1, 1}, {50, 100, 50}, {95, 100, 95}, {99, 100, 99}, {50, 101, 51}, {95, 20, 19}, {99, 20, 20},
		{99, 1_000_000, 990_000}, {50, 0, 1},
	} {
		if got := store.PercentileRank(tc.pct, tc.n); got != tc.want {
			t.Errorf("PercentileRank(%d, %d) = %d, want %d", tc.pct, tc.n, got, tc.want)
		}
	}
}

func TestSamples(t *testing.T) {
	for _, tc := range []struct {
		name string
		call event.ToolCall
		ok   bool
	}{
		{"ok", event.ToolCall{Outcome: event.OutcomeOK, DurationMS: 5}, true},
		{"error", event.ToolCall{Outcome: event.OutcomeError, DurationMS: 5}, true},
		{"timed out", event.ToolCall{Outcome: event.OutcomeTimedOut, Phase: budget.PhaseTool, DurationMS: 5}, true},
		{"idle", event.ToolCall{Outcome: event.OutcomeTimedOut, Phase: budget.PhaseToolIdle, DurationMS: 5}, true},
		{"abandoned at its timeout", event.ToolCall{Outcome: event.OutcomeAbandoned, Abandoned: true, Phase: budget.PhaseTool, DurationMS: 5}, true},
		{"abandoned when the turn ended", event.ToolCall{Outcome: event.OutcomeAbandoned, Abandoned: true, Phase: budget.PhaseTurn}, false},
		{"cancelled", event.ToolCall{Outcome: event.OutcomeCancelled, Phase: budget.PhaseCancel}, false},
		{"interrupted", event.ToolCall{Outcome: event.OutcomeInterrupted}, false},
		{"refused", event.ToolCall{Outcome: event.OutcomeError, Refused: "unknown_tool"}, false},
	} {
		if ms, ok := store.ToolSample(tc.call); ok != tc.ok || (ok && ms != 5) {
			t.Errorf("ToolSample(%s) = %d, %v", tc.name, ms, ok)
		}
	}
	for _, tc := range []struct {
		name  string
		call  event.ModelCall
		phase budget.Phase
		ms    int64
		ok    bool
	}{
		{"reply", event.ModelCall{Outcome: event.OutcomeOK, FirstChunkMS: 30, StreamMS: 900}, budget.PhaseLLMFirstChunk, 30, true},
		{"a first chunk in under 1ms", event.ModelCall{Outcome: event.OutcomeOK, StreamMS: 9}, budget.PhaseLLMFirstChunk, 0, true},
		{"no first chunk in time", event.ModelCall{Outcome: event.OutcomeTimedOut, Phase: budget.PhaseLLMFirstChunk, StreamMS: 60000}, budget.PhaseLLMFirstChunk, 60000, true},
		{"silent after its first chunk", event.ModelCall{Outcome: event.OutcomeTimedOut, Phase: budget.PhaseLLMIdle, FirstChunkMS: 40}, budget.PhaseLLMFirstChunk, 40, true},
		{"HTTP 429", event.ModelCall{Outcome: event.OutcomeError, Phase: budget.PhaseLLMHTTP, StreamMS: 80}, budget.PhaseLLMFirstChunk, 0, false},
		{"compaction", event.ModelCall{Compaction: true, Outcome: event.OutcomeInsufficient, FirstChunkMS: 30, StreamMS: 800}, budget.PhaseCompaction, 800, true},
		{"compaction timed out", event.ModelCall{Compaction: true, Outcome: event.OutcomeTimedOut, Phase: budget.PhaseCompaction, StreamMS: 60000}, budget.PhaseCompaction, 60000, true},
		{"compaction cancelled", event.ModelCall{Compaction: true, Outcome: event.OutcomeCancelled, Phase: budget.PhaseCancel}, budget.PhaseCompaction, 0, false},
	} {
		phase, ms, ok := store.ModelSample(tc.call)
		if phase != tc.phase || ms != tc.ms || ok != tc.ok {
			t.Errorf("ModelSample(%s) = %s, %d, %v; want %s, %d, %v", tc.name, phase, ms, ok, tc.phase, tc.ms, tc.ok)
		}
	}
}
