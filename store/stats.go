package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
)

// CallStats is a store that sums up its call records for `timebox stats`
// and `timebox validate` (SQLite and PostgreSQL): per tool, and per model
// endpoint and phase, how many calls there were, how long they took
// (percentiles computed by the database, so that a million calls answer
// in well under two seconds: docs/BENCHMARKS.md) and how they ended. What
// the figures mean for a budget — the suggestion, the warnings — is
// internal/advice's, not the store's.
type CallStats interface {
	// ToolStats returns one ToolStat per tool that has calls matching f,
	// sorted by tool name.
	ToolStats(ctx context.Context, f StatsFilter) ([]ToolStat, error)
	// ModelStats returns one ModelStat per model endpoint and phase that
	// has attempts matching f, sorted by endpoint, then phase.
	ModelStats(ctx context.Context, f StatsFilter) ([]ModelStat, error)
	// ToolHistogram counts the sample (ToolSample) of one tool's calls
	// matching f (f.Tool is ignored) by duration, in one pass of the
	// database: bounds are ascending durations in milliseconds, and the
	// result has len(bounds)+1 counts — calls under bounds[0], then calls
	// of bounds[i-1] ms or more and under bounds[i], then calls of
	// bounds[len(bounds)-1] ms or more — summing to the tool's Sample.
	// No bounds is one count, the whole sample.
	ToolHistogram(ctx context.Context, f StatsFilter, tool string, bounds []int64) ([]int64, error)
}

// StatsFilter selects the call records CallStats sums up. The zero value
// takes every record.
type StatsFilter struct {
	// Since keeps the calls that started at or after it; zero keeps all.
	Since time.Time
	// Tool keeps one tool's calls (ToolStats) or none of the model calls
	// (ModelStats); empty keeps all.
	Tool string
}

// ToolStat sums up the calls of one tool. Durations are milliseconds.
//
// The percentiles are of the calls whose duration says how long the tool
// takes (ToolSample): they end on their own (ok, error) or by their own
// budget (timed out, abandoned in phase tool or tool_idle), whose true
// duration is at least what was recorded. Percentiles are nearest-rank:
// the p-th is the smallest duration that at least p% of the sample do not
// exceed (PostgreSQL's percentile_disc).
type ToolStat struct {
	// Tool is the tool's name.
	Tool string
	// Calls counts the calls that ran: a call refused before it ran (an
	// unknown tool, bad arguments, max_tool_calls) is not counted.
	Calls int64
	// Sample counts the calls the percentiles are of (ToolSample).
	Sample int64
	// P50MS, P95MS and P99MS are the 50th, 95th and 99th percentiles of
	// the sample's durations, and MaxMS its longest; 0 when the sample is
	// empty.
	P50MS, P95MS, P99MS, MaxMS int64
	// MinMS is the shortest call of the sample: with MaxMS, the range a
	// histogram of it spans (ToolHistogram).
	MinMS int64
	// MaxOKMS is the longest call that answered (outcome ok); 0 when none
	// did.
	MaxOKMS int64
	// CutOff counts the calls of the sample that their timeout ended
	// (timed out, or abandoned after it; phase tool): their true duration
	// is unknown, at least what was recorded. CutOffTimeoutMS is the
	// largest timeout they were cut off at. IdleCutOff and
	// IdleCutOffTimeoutMS are the same for the idle timeout (phase
	// tool_idle).
	CutOff, CutOffTimeoutMS         int64
	IdleCutOff, IdleCutOffTimeoutMS int64
	// TimedOut counts outcome timed_out (phase tool or tool_idle);
	// IdleTimedOut those of them ended by the idle timeout (tool_idle).
	TimedOut, IdleTimedOut int64
	// Overran counts advisory calls that ran past their timeout;
	// Abandoned, cooperative calls that did not return after they were
	// stopped; Cancelled, calls the turn's end or a client stopped;
	// Interrupted, calls whose process died.
	Overran, Abandoned, Cancelled, Interrupted int64
	// TimeoutMS and IdleTimeoutMS are the budget of the latest call
	// (IdleTimeoutMS 0: off).
	TimeoutMS, IdleTimeoutMS int64
	// Progressed counts the calls of the sample that reported progress at
	// least once.
	Progressed int64
	// MaxSilenceMS is the longest silence of a call of the sample: the
	// longest time without a progress report, from the call's start to its
	// first report, between two reports, or from the last to its end
	// (LongestSilence) — for a call that reported nothing, its duration.
	// It is what an idle_timeout must exceed. Calls stored before timebox
	// measured it (store schemas before this one) have none; 0 when no
	// call has.
	MaxSilenceMS int64
}

// ModelStat sums up the attempts of one model endpoint in one phase.
// Durations are milliseconds.
type ModelStat struct {
	// Endpoint is "provider:model".
	Endpoint string
	// Phase is the budget the attempts are measured against:
	// llm_first_chunk (the time to the first chunk of the stream) for
	// replies, compaction (the whole call) for history compactions
	// (ModelSample).
	Phase budget.Phase
	// Calls counts the attempts.
	Calls int64
	// Sample counts the attempts the percentiles are of (ModelSample).
	Sample int64
	// P50MS, P95MS and P99MS are the 50th, 95th and 99th percentiles of
	// the sample's times in Phase, and MaxMS its longest; 0 when the
	// sample is empty.
	P50MS, P95MS, P99MS, MaxMS int64
	// MaxOKMS is the longest of the attempts that succeeded.
	MaxOKMS int64
	// TimedOut counts the attempts the phase's own budget ended (their
	// true time is unknown, at least what was recorded); IdleTimedOut,
	// replies whose stream went silent past timeouts.llm_idle after it
	// began (llm_first_chunk rows only).
	TimedOut, IdleTimedOut int64
	// Failed counts the other failures (outcome error: HTTP errors,
	// refused requests); Cancelled, attempts the turn's end or a client
	// stopped.
	Failed, Cancelled int64
}

// CheckBounds returns an error for histogram bounds (CallStats.ToolHistogram)
// that are not strictly ascending.
func CheckBounds(bounds []int64) error {
	for i := 1; i < len(bounds); i++ {
		if bounds[i] <= bounds[i-1] {
			return fmt.Errorf("histogram bounds must ascend: %d after %d", bounds[i], bounds[i-1])
		}
	}
	return nil
}

// PercentileRank returns the 1-based rank, in ascending order, of the
// pct-th percentile of n values by the nearest-rank method: the smallest
// rank at or above pct% of n. It is 1 for n <= 1.
func PercentileRank(pct, n int64) int64 {
	return max((pct*n+99)/100, 1)
}

// ToolSample returns the duration of a tool call that enters its tool's
// percentiles (ToolStat), and whether it does: a call that ran and ended
// on its own (ok, error) or by its own budget (timed_out, or abandoned in
// phase tool or tool_idle). A refused call never ran; a call that the
// turn's end, a client or a dead process stopped says nothing of how long
// the tool takes. Both stores call it as they store a record.
func ToolSample(tc event.ToolCall) (int64, bool) {
	if tc.Refused != "" {
		return 0, false
	}
	switch tc.Outcome {
	case event.OutcomeOK, event.OutcomeError, event.OutcomeTimedOut, event.OutcomeAbandoned:
	default:
		return 0, false
	}
	switch tc.Phase {
	case "", budget.PhaseTool, budget.PhaseToolIdle:
		return tc.DurationMS, true
	}
	return 0, false
}

// ModelSample returns the phase whose budget a model call attempt is
// measured against, and the time it counts there when it does: a
// compaction call's whole time against timeouts.compaction; a reply's time
// to its first chunk against timeouts.llm_first_chunk — for an attempt
// that got one (or succeeded), or that the first-chunk budget ended (its
// whole time, at least the budget). An attempt that failed before its
// first chunk for another reason (HTTP 429, a refused request, a cancel)
// says nothing of that time. Both stores call it as they store a record.
func ModelSample(mc event.ModelCall) (phase budget.Phase, ms int64, ok bool) {
	if mc.Compaction {
		switch {
		case mc.Outcome == event.OutcomeOK, mc.Outcome == event.OutcomeInsufficient,
			mc.Phase == budget.PhaseCompaction:
			return budget.PhaseCompaction, mc.StreamMS, true
		}
		return budget.PhaseCompaction, 0, false
	}
	switch {
	case mc.Phase == budget.PhaseLLMFirstChunk:
		return budget.PhaseLLMFirstChunk, mc.StreamMS, true
	case mc.Outcome == event.OutcomeOK, mc.FirstChunkMS > 0:
		return budget.PhaseLLMFirstChunk, mc.FirstChunkMS, true
	}
	return budget.PhaseLLMFirstChunk, 0, false
}

// LongestSilence returns the longest time a call went without a progress
// report, in whole milliseconds: from its start to its first report,
// between two reports, or from its last report to its end. reports are
// the times of its tool_progress events, in any order; those outside
// [start, end] are clamped to it. With no report it is the whole call.
// The events are coalesced (at most one per call every 100ms, the last
// always sent), so the figure may exceed the true one by up to 100ms.
func LongestSilence(start, end time.Time, reports []time.Time) int64 {
	if end.Before(start) {
		end = start
	}
	ats := make([]time.Time, 0, len(reports)+1)
	for _, at := range reports {
		switch {
		case at.Before(start):
			at = start
		case at.After(end):
			at = end
		}
		ats = append(ats, at)
	}
	slices.SortFunc(ats, time.Time.Compare)
	longest, last := time.Duration(0), start
	for _, at := range append(ats, end) {
		longest = max(longest, at.Sub(last))
		last = at
	}
	return longest.Milliseconds()
}

// ToolSilence returns the longest silence of a tool call (LongestSilence)
// given the times of its progress events: its duration when it reported
// none.
func ToolSilence(tc event.ToolCall, reports []time.Time) int64 {
	if len(reports) == 0 {
		return tc.DurationMS
	}
	end := tc.EndedAt
	if end.IsZero() {
		end = tc.StartedAt.Add(time.Duration(tc.DurationMS) * time.Millisecond)
	}
	return LongestSilence(tc.StartedAt, end, reports)
}

// ProgressPattern is what the stored JSON of a tool_progress event of call
// callID contains, and no other event's: `"call_id":"<id>",` as
// event.Event's MarshalJSON writes it (the key at the top level, where a
// string value cannot hold it unescaped). The stores find a call's
// progress events with it without parsing every event of its turn.
func ProgressPattern(callID string) string {
	b, _ := json.Marshal(callID)
	return `"call_id":` + string(b) + `,`
}
