package storetest

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
)

// RunStats checks a store.CallStats against records with known figures,
// written through the store's own write paths: events appended one by one
// (progress reports at known times, tool_finished carrying its record),
// then the turn's final record. open returns a new, empty store, which
// RunStats closes.
func RunStats(t *testing.T, open func(t *testing.T) store.Store) {
	s := open(t)
	defer s.Close()
	cs, ok := s.(store.CallStats)
	if !ok {
		t.Fatalf("%T is not a store.CallStats", s)
	}
	ctx := context.Background()
	since := statsEpoch.Add(time.Hour)
	seedStats(t, s, since)

	tools, err := cs.ToolStats(ctx, store.StatsFilter{Since: since})
	if err != nil {
		t.Fatal(err)
	}
	want := []store.ToolStat{
		{
			// Durations 1..100 ms (98 to 100 timed out at their 100ms
			// budget) and an error after 50ms, the latest call, whose
			// budget was 200ms; then what must not enter the
			// percentiles: two calls cancelled by the turn after 5s, one
			// interrupted after 9s, one refused; and before since, ten
			// calls of 99s.
			Tool: "fetch", Calls: 104, Sample: 101, P50MS: 50, P95MS: 95, P99MS: 99, MaxMS: 100, MinMS: 1, MaxOKMS: 97,
			CutOff: 3, CutOffTimeoutMS: 100, TimedOut: 3, Cancelled: 2, Interrupted: 1, TimeoutMS: 200, MaxSilenceMS: 100,
		},
		{
			// 20 calls of 1s reporting progress at 100, 300 and 600ms
			// (silences 100, 200, 300 and 400ms to the end), one of them at
			// 100 and 800ms (700ms), one stopped by its 900ms idle timeout
			// after 900ms of silence, and the latest, advisory with a
			// 500ms budget, that overran.
			Tool: "crawl", Calls: 22, Sample: 22, P50MS: 1000, P95MS: 1000, P99MS: 1000, MaxMS: 1000, MinMS: 1000, MaxOKMS: 1000,
			IdleCutOff: 1, IdleCutOffTimeoutMS: 900, TimedOut: 1, IdleTimedOut: 1, Overran: 1, TimeoutMS: 500, IdleTimeoutMS: 900,
			Progressed: 22, MaxSilenceMS: 900,
		},
		{
			// One call of 10ms, and one the turn cancelled: no call cut
			// off by its own budget at all (a sum over none is 0, not
			// NULL).
			Tool: "notify", Calls: 2, Sample: 1, P50MS: 10, P95MS: 10, P99MS: 10, MaxMS: 10, MinMS: 10, MaxOKMS: 10,
			Cancelled: 1, TimeoutMS: 1000, MaxSilenceMS: 10,
		},
	}
	sortByTool := func(ts []store.ToolStat) map[string]store.ToolStat {
		m := map[string]store.ToolStat{}
		for _, x := range ts {
			m[x.Tool] = x
		}
		return m
	}
	if d := cmp.Diff(sortByTool(want), sortByTool(tools)); d != "" {
		t.Errorf("ToolStats (-want +got):\n%s", d)
	}
	if len(tools) == 3 && tools[0].Tool != "crawl" {
		t.Errorf("ToolStats not sorted by tool: %s, %s", tools[0].Tool, tools[1].Tool)
	}

	one, err := cs.ToolStats(ctx, store.StatsFilter{Tool: "fetch"})
	if err != nil {
		t.Fatal(err)
	}
	if len(one) != 1 || one[0].Calls != 114 || one[0].Sample != 111 || one[0].MaxMS != 99000 || one[0].P95MS != 99000 || one[0].P50MS != 55 {
		t.Errorf("ToolStats of fetch at all times: %+v", one)
	}
	if none, err := cs.ToolStats(ctx, store.StatsFilter{Since: time.Now().Add(time.Hour)}); err != nil || len(none) != 0 || none == nil {
		t.Errorf("ToolStats of nothing: %#v, %v (want an empty list)", none, err)
	}
	checkHistogram(t, cs, since)

	models, err := cs.ModelStats(ctx, store.StatsFilter{Since: since})
	if err != nil {
		t.Fatal(err)
	}
	wantModels := []store.ModelStat{
		{
			// Two compactions: 1s, and 3s that left the history too long.
			Endpoint: "script:m", Phase: budget.PhaseCompaction, Calls: 2, Sample: 2, P50MS: 1000, P95MS: 3000, P99MS: 3000,
			MaxMS: 3000, MaxOKMS: 3000,
		},
		{
			// 20 replies whose first chunk came after 10..200ms, one more
			// after 30ms whose stream then went silent, one that got no
			// first chunk within 5s, one refused with HTTP 429.
			Endpoint: "script:m", Phase: budget.PhaseLLMFirstChunk, Calls: 23, Sample: 22, P50MS: 100, P95MS: 200, P99MS: 5000,
			MaxMS: 5000, MaxOKMS: 200, TimedOut: 1, IdleTimedOut: 1, Failed: 1,
		},
	}
	if d := cmp.Diff(wantModels, models); d != "" {
		t.Errorf("ModelStats (-want +got):\n%s", d)
	}
	if m, err := cs.ModelStats(ctx, store.StatsFilter{Tool: "fetch"}); err != nil || len(m) != 0 {
		t.Errorf("ModelStats with a tool filter: %+v, %v", m, err)
	}
}

// checkHistogram counts the seeded sample by duration (ToolHistogram):
// fetch's 1..100ms and 50ms, crawl's 22 calls of 1s; calls outside the
// sample (cancelled, interrupted, refused) and before since never counted.
func checkHistogram(t *testing.T, cs store.CallStats, since time.Time) {
	t.Helper()
	ctx := context.Background()
	for _, c := range []struct {
		tool   string
		since  time.Time
		bounds []int64
		want   []int64
	}{
		// Under 10, 10..49, 50..99, 100 and more: 1..9; 10..49; 50..97
		// and 98, 99 (timed out, in the sample) and the error of 50ms;
		// 100.
		{"fetch", since, []int64{10, 50, 100}, []int64{9, 40, 51, 1}},
		{"fetch", since, []int64{1, 101}, []int64{0, 101, 0}},
		// At all times, the ten calls of 99s are counted too.
		{"fetch", time.Time{}, []int64{1000}, []int64{101, 10}},
		{"fetch", since, nil, []int64{101}},
		// A bound equal to a duration puts it in the bucket above.
		{"crawl", since, []int64{999, 1000, 1001}, []int64{0, 0, 22, 0}},
		{"nothing", since, []int64{10, 20}, []int64{0, 0, 0}},
	} {
		got, err := cs.ToolHistogram(ctx, store.StatsFilter{Since: c.since}, c.tool, c.bounds)
		if err != nil {
			t.Errorf("ToolHistogram(%s, %v): %v", c.tool, c.bounds, err)
			continue
		}
		if d := cmp.Diff(c.want, got); d != "" {
			t.Errorf("ToolHistogram(%s, since %v, %v) (-want +got):\n%s", c.tool, c.since.IsZero(), c.bounds, d)
		}
	}
	if _, err := cs.ToolHistogram(ctx, store.StatsFilter{}, "fetch", []int64{10, 10}); err == nil {
		t.Error("ToolHistogram took bounds that do not ascend")
	}
}

// statsEpoch is when the seeded calls begin.
var statsEpoch = time.Date(2025, 3, 4, 10, 0, 0, 0, time.UTC)

// statsTurn writes one turn's events, one AppendEvent each, then its final
// record.
type statsTurn struct {
	t      *testing.T
	s      store.Store
	id     string
	seq    int64
	at     time.Time
	tools  []event.ToolCall
	models []event.ModelCall
}

func newStatsTurn(t *testing.T, s store.Store, id string, at time.Time) *statsTurn {
	t.Helper()
	if err := s.BeginTurn(context.Background(), store.TurnStart{TurnID: id, Agent: "stats", Input: "x", StartedAt: at}); err != nil {
		t.Fatal(err)
	}
	return &statsTurn{t: t, s: s, id: id, at: at}
}

func (st *statsTurn) emit(at time.Time, d event.Payload) {
	st.t.Helper()
	st.seq++
	e := event.Event{Seq: st.seq, TurnID: st.id, Type: d.Type(), At: at, Data: d}
	if err := st.s.AppendEvent(context.Background(), e); err != nil {
		st.t.Fatal(err)
	}
}

// tool writes a call that started at start, its progress reports at the
// given offsets, and its end.
func (st *statsTurn) tool(tc event.ToolCall, start time.Time, progress ...time.Duration) {
	tc.CallID = fmt.Sprintf("call_%d", len(st.tools)+1)
	tc.TurnID, tc.Kind, tc.Arguments = st.id, "exec", json.RawMessage(`{}`)
	tc.StartedAt, tc.EndedAt = start, start.Add(time.Duration(tc.DurationMS)*time.Millisecond)
	tc.ProgressCount = len(progress)
	if tc.Refused == "" {
		st.emit(start, &event.ToolStarted{CallID: tc.CallID, Tool: tc.Tool, Kind: tc.Kind, TimeoutMS: tc.TimeoutMS})
	}
	for _, p := range progress {
		st.emit(start.Add(p), &event.ToolProgress{CallID: tc.CallID, Tool: tc.Tool, Message: "a report"})
	}
	st.emit(tc.EndedAt, &event.ToolFinished{ToolCall: tc})
	st.tools = append(st.tools, tc)
}

func (st *statsTurn) model(mc event.ModelCall) {
	mc.Step, mc.Attempt, mc.Model, mc.Provider, mc.StartedAt = len(st.models)+1, 1, "m", "script", st.at
	st.emit(st.at, &event.LLMFinished{ModelCall: mc})
	st.models = append(st.models, mc)
}

// finish stores the final record: every call record again, through
// FinishTurn's path.
func (st *statsTurn) finish() {
	st.t.Helper()
	rec := &event.Turn{TurnID: st.id, Agent: "stats", Input: "x", Status: budget.StatusCompleted, StopReason: budget.Answered,
		StartedAt: st.at, EndedAt: st.at.Add(time.Minute), ToolCalls: st.tools, ModelCalls: st.models}
	if err := st.s.FinishTurn(context.Background(), rec, nil); err != nil {
		st.t.Fatal(err)
	}
}

func seedStats(t *testing.T, s store.Store, since time.Time) {
	// Before since: ten calls of fetch that took 99s.
	old := newStatsTurn(t, s, "t_old", statsEpoch)
	for i := range 10 {
		old.tool(event.ToolCall{Tool: "fetch", DurationMS: 99000, TimeoutMS: 100000, Outcome: event.OutcomeOK}, statsEpoch.Add(time.Duration(i)*time.Minute))
	}
	old.finish()

	at := since.Add(time.Minute)
	next := func() time.Time { at = at.Add(time.Second); return at }
	// fetch: 1..100ms, in ten turns of ten calls.
	for k := range 10 {
		tr := newStatsTurn(t, s, fmt.Sprintf("t_fetch_%d", k), next())
		for i := range 10 {
			d := int64(k*10 + i + 1)
			tc := event.ToolCall{Tool: "fetch", DurationMS: d, TimeoutMS: 100, Outcome: event.OutcomeOK}
			if d >= 98 {
				tc.Outcome, tc.Phase = event.OutcomeTimedOut, budget.PhaseTool
			}
			tr.tool(tc, next())
		}
		tr.finish()
	}
	tr := newStatsTurn(t, s, "t_fetch_rest", next())
	for range 2 {
		tr.tool(event.ToolCall{Tool: "fetch", DurationMS: 5000, TimeoutMS: 100, Outcome: event.OutcomeCancelled, Phase: budget.PhaseTurn}, next())
	}
	tr.tool(event.ToolCall{Tool: "fetch", DurationMS: 9000, TimeoutMS: 100, Outcome: event.OutcomeInterrupted}, next())
	tr.tool(event.ToolCall{Tool: "fetch", Outcome: event.OutcomeError, Refused: "invalid_arguments"}, next())
	// The latest call that ran sets the current budget.
	tr.tool(event.ToolCall{Tool: "fetch", DurationMS: 50, TimeoutMS: 200, Outcome: event.OutcomeError}, next())
	tr.finish()

	// notify: nothing unusual but a cancellation.
	tr = newStatsTurn(t, s, "t_notify", next())
	tr.tool(event.ToolCall{Tool: "notify", DurationMS: 10, TimeoutMS: 1000, Outcome: event.OutcomeOK}, next())
	tr.tool(event.ToolCall{Tool: "notify", DurationMS: 5000, TimeoutMS: 1000, Outcome: event.OutcomeCancelled, Phase: budget.PhaseTurn}, next())
	tr.finish()

	// crawl: silences measured from the progress events.
	ms := time.Millisecond
	for k := range 2 {
		tr := newStatsTurn(t, s, fmt.Sprintf("t_crawl_%d", k), next())
		for i := range 10 {
			tc := event.ToolCall{Tool: "crawl", DurationMS: 1000, TimeoutMS: 5000, IdleTimeoutMS: 900, Outcome: event.OutcomeOK}
			if k == 1 && i == 9 {
				tr.tool(tc, next(), 100*ms, 800*ms)
			} else {
				tr.tool(tc, next(), 100*ms, 300*ms, 600*ms)
			}
		}
		tr.finish()
	}
	tr = newStatsTurn(t, s, "t_crawl_rest", next())
	tr.tool(event.ToolCall{Tool: "crawl", DurationMS: 1000, TimeoutMS: 5000, IdleTimeoutMS: 900, Outcome: event.OutcomeTimedOut,
		Phase: budget.PhaseToolIdle}, next(), 100*ms)
	tr.tool(event.ToolCall{Tool: "crawl", DurationMS: 1000, TimeoutMS: 500, IdleTimeoutMS: 900, Enforcement: budget.Advisory,
		Outcome: event.OutcomeOK, Overran: true}, next(), 50*ms, 100*ms, 500*ms, 999*ms)

	// Model calls.
	for i := range 20 {
		tr.model(event.ModelCall{FirstChunkMS: int64(10 * (i + 1)), StreamMS: 400, Outcome: event.OutcomeOK})
	}
	tr.model(event.ModelCall{FirstChunkMS: 30, StreamMS: 2000, Outcome: event.OutcomeTimedOut, Phase: budget.PhaseLLMIdle})
	tr.model(event.ModelCall{StreamMS: 5000, Outcome: event.OutcomeTimedOut, Phase: budget.PhaseLLMFirstChunk})
	tr.model(event.ModelCall{StreamMS: 80, Outcome: event.OutcomeError, Phase: budget.PhaseLLMHTTP, Error: "429"})
	tr.model(event.ModelCall{FirstChunkMS: 300, StreamMS: 1000, Outcome: event.OutcomeOK, Compaction: true})
	tr.model(event.ModelCall{FirstChunkMS: 300, StreamMS: 3000, Outcome: event.OutcomeInsufficient, Compaction: true})
	tr.finish()
}

// LegacyTurn is the turn that holds LegacyCalls.
const LegacyTurn = "t_legacy"

// LegacyCalls are call records as a store of an earlier schema holds them
// (before the columns CallStats reads), for the stores' migration tests:
// 25 calls of fetch that took 1..25ms, the last timed out at its 25ms
// budget, the 10th having reported progress (its silence was never
// measured); one refused call; 20 replies of script:m whose first chunk
// came after 10..200ms, and a compaction of 700ms. Each started a second
// after the one before, from statsEpoch.
func LegacyCalls() ([]event.ToolCall, []event.ModelCall) {
	var tools []event.ToolCall
	at := statsEpoch
	for i := range 25 {
		at = at.Add(time.Second)
		tc := event.ToolCall{CallID: fmt.Sprintf("call_%d", i), TurnID: LegacyTurn, Tool: "fetch", Kind: "exec",
			Arguments: json.RawMessage(`{"timeout_ms":1}`), StartedAt: at, EndedAt: at.Add(time.Duration(i+1) * time.Millisecond),
			DurationMS: int64(i + 1), TimeoutMS: 25, TimeoutSource: budget.SourceTool, Enforcement: budget.Hard, Outcome: event.OutcomeOK}
		if i == 9 {
			tc.ProgressCount = 3
		}
		if i == 24 {
			tc.Outcome, tc.Phase = event.OutcomeTimedOut, budget.PhaseTool
		}
		tools = append(tools, tc)
	}
	tools = append(tools, event.ToolCall{CallID: "call_refused", TurnID: LegacyTurn, Tool: "fetch", Kind: "exec",
		StartedAt: at, Outcome: event.OutcomeError, Refused: "invalid_arguments"})
	var models []event.ModelCall
	for i := range 20 {
		models = append(models, event.ModelCall{Step: i + 1, Model: "m", Provider: "script", Attempt: 1,
			StartedAt: statsEpoch.Add(time.Duration(i) * time.Second), FirstChunkMS: int64(10 * (i + 1)), StreamMS: 500, Outcome: event.OutcomeOK})
	}
	models = append(models, event.ModelCall{Step: 21, Model: "m", Provider: "script", Attempt: 1, StartedAt: statsEpoch,
		FirstChunkMS: 200, StreamMS: 700, Outcome: event.OutcomeOK, Compaction: true})
	return tools, models
}

// CheckLegacyStats checks what cs says of LegacyCalls once its store has
// migrated them.
func CheckLegacyStats(t *testing.T, cs store.CallStats) {
	t.Helper()
	ctx := context.Background()
	tools, err := cs.ToolStats(ctx, store.StatsFilter{Since: statsEpoch})
	if err != nil {
		t.Fatal(err)
	}
	want := []store.ToolStat{{Tool: "fetch", Calls: 25, Sample: 25, P50MS: 13, P95MS: 24, P99MS: 25, MaxMS: 25, MinMS: 1, MaxOKMS: 24,
		CutOff: 1, CutOffTimeoutMS: 25, TimedOut: 1, TimeoutMS: 25, Progressed: 1, MaxSilenceMS: 25}}
	if d := cmp.Diff(want, tools); d != "" {
		t.Errorf("ToolStats of migrated records (-want +got):\n%s", d)
	}
	models, err := cs.ModelStats(ctx, store.StatsFilter{Since: statsEpoch.Add(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	wantModels := []store.ModelStat{{Endpoint: "script:m", Phase: budget.PhaseLLMFirstChunk, Calls: 10, Sample: 10,
		P50MS: 150, P95MS: 200, P99MS: 200, MaxMS: 200, MaxOKMS: 200}}
	if d := cmp.Diff(wantModels, models); d != "" {
		t.Errorf("ModelStats of migrated records since their 11th (-want +got):\n%s", d)
	}
}
