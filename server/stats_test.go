package server_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/advice"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/tool"
)

// seedCalls stores one turn of tool calls through the store's record
// writers (tool_started and tool_finished events one by one, then the
// turn's record), each call starting a second after the one before from
// at.
func seedCalls(t *testing.T, st store.Store, id string, at time.Time, calls []event.ToolCall) {
	t.Helper()
	ctx := context.Background()
	if err := st.BeginTurn(ctx, store.TurnStart{TurnID: id, Agent: "test", Input: "x", StartedAt: at}); err != nil {
		t.Fatal(err)
	}
	var seq int64
	emit := func(at time.Time, d event.Payload) {
		seq++
		if err := st.AppendEvent(ctx, event.Event{Seq: seq, TurnID: id, Type: d.Type(), At: at, Data: d}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range calls {
		tc := &calls[i]
		tc.CallID, tc.TurnID, tc.Kind, tc.Arguments = fmt.Sprintf("call_%d", i), id, "go", json.RawMessage(`{}`)
		tc.StartedAt = at.Add(time.Duration(i) * time.Second)
		tc.EndedAt = tc.StartedAt.Add(time.Duration(tc.DurationMS) * time.Millisecond)
		emit(tc.StartedAt, &event.ToolStarted{CallID: tc.CallID, Tool: tc.Tool, Kind: tc.Kind, TimeoutMS: tc.TimeoutMS})
		emit(tc.EndedAt, &event.ToolFinished{ToolCall: *tc})
	}
	rec := &event.Turn{TurnID: id, Agent: "test", Input: "x", Status: budget.StatusCompleted, StopReason: budget.Answered,
		StartedAt: at, EndedAt: at.Add(time.Hour), ToolCalls: calls}
	if err := st.FinishTurn(ctx, rec, nil); err != nil {
		t.Fatal(err)
	}
}

// TestStatsRoute: GET /v1/stats on a SQLite store is the report of
// internal/advice against the agent's budgets, each tool with a histogram
// that the database counted and that sums to its sample.
func TestStatsRoute(t *testing.T) {
	st := openStore(t)
	now := time.Now()
	// fetch: 30 calls of 7..290ms, one cut off at its 400ms timeout, one
	// cancelled by its turn (outside the sample); 40 days ago, 5 of 9s.
	var fetch []event.ToolCall
	var fetchMS []int64
	for i := range 30 {
		d := int64(7 + 10*i - i%3)
		fetch = append(fetch, event.ToolCall{Tool: "fetch", DurationMS: d, TimeoutMS: 400, Outcome: event.OutcomeOK})
		fetchMS = append(fetchMS, d)
	}
	fetch = append(fetch,
		event.ToolCall{Tool: "fetch", DurationMS: 400, TimeoutMS: 400, Outcome: event.OutcomeTimedOut, Phase: budget.PhaseTool},
		event.ToolCall{Tool: "fetch", DurationMS: 50, TimeoutMS: 400, Outcome: event.OutcomeCancelled, Phase: budget.PhaseTurn})
	fetchMS = append(fetchMS, 400)
	seedCalls(t, st, "t_fetch", now.Add(-2*time.Hour), fetch)
	var old []event.ToolCall
	for range 5 {
		old = append(old, event.ToolCall{Tool: "fetch", DurationMS: 9000, TimeoutMS: 10000, Outcome: event.OutcomeOK})
	}
	seedCalls(t, st, "t_old", now.AddDate(0, 0, -40), old)
	// crawl: 4 calls of 2s (too few for a suggestion).
	var crawl []event.ToolCall
	for range 4 {
		crawl = append(crawl, event.ToolCall{Tool: "crawl", DurationMS: 2000, TimeoutMS: 5000, Outcome: event.OutcomeOK})
	}
	seedCalls(t, st, "t_crawl", now.Add(-time.Hour), crawl)

	noop := func(context.Context, json.RawMessage, tool.Progress) (any, error) { return "ok", nil }
	a := newAgent(t, scripted(t, `{"text": "hi"}`),
		goTool("fetch", budget.Cooperative, 300*time.Millisecond, noop), goTool("crawl", budget.Cooperative, 5*time.Second, noop))
	const token = "stats-token-0123456789abcdef"
	e := newEnv(t, server.Config{Agent: a, Store: st, Token: token})
	auth := []string{"Authorization", "Bearer " + token}

	rep := decode[server.StatsReport](t, e.do("GET", "/v1/stats?since=7d", nil, auth...), 200)
	if got := toolNames(rep); !slices.Equal(got, []string{"crawl", "fetch"}) {
		t.Fatalf("tools %q, want crawl and fetch", got)
	}
	if rep.Since == nil || rep.Since.After(now.AddDate(0, 0, -7).Add(time.Minute)) || rep.Agent != "" {
		t.Errorf("since %v, agent %q", rep.Since, rep.Agent)
	}

	// The same report as internal/advice makes of the store's figures,
	// against the agent's budgets.
	cs := st.(store.CallStats)
	stats, err := cs.ToolStats(context.Background(), store.StatsFilter{Since: *rep.Since})
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]agent.Tool{}
	for _, at := range a.Tools() {
		byName[at.Tool.Spec().Name] = at
	}
	budgets := advice.Budgets{ToolMax: a.Budgets().ToolMax.D, Tool: func(name string) (budget.ToolBudget, bool) {
		at, ok := byName[name]
		return at.Budget, ok
	}}
	for i, got := range rep.Tools {
		want := advice.NewTool(stats[i], budgets)
		if d := cmp.Diff(want, got.Tool); d != "" {
			t.Errorf("%s (-advice +route):\n%s", got.Tool.Tool, d)
		}
	}
	f := rep.Tools[1]
	if f.TimeoutMS != 300 || f.TimeoutSource != "tool" || f.SuggestedTimeoutMS == nil || f.Sample != 31 || f.Cancelled != 1 || f.TimedOut != 1 {
		t.Errorf("fetch: %+v", f.Tool)
	}
	// The rule: at least twice the 400ms timeout a call was cut off at
	// (1 in 31 is over 1%), rounded up to a human value.
	if want := advice.Human(800 * time.Millisecond).Milliseconds(); f.SuggestedTimeoutMS != nil && *f.SuggestedTimeoutMS != want {
		t.Errorf("fetch's suggestion %d, want %d", *f.SuggestedTimeoutMS, want)
	}
	if c := rep.Tools[0]; c.SuggestedTimeoutMS != nil || c.TimeoutMS != 5000 {
		t.Errorf("crawl: %+v", c.Tool)
	}

	// The histograms: bounds from the shortest call to one past the
	// longest, each bucket holding the calls between its bounds.
	for _, c := range []struct {
		t         server.ToolStats
		durations []int64
	}{{rep.Tools[1], fetchMS}, {rep.Tools[0], []int64{2000, 2000, 2000, 2000}}} {
		h := c.t.Histogram
		if len(h.BoundsMS) != len(h.Counts)+1 || len(h.Counts) == 0 || len(h.Counts) > server.HistogramBuckets {
			t.Fatalf("%s: %d bounds, %d counts", c.t.Tool.Tool, len(h.BoundsMS), len(h.Counts))
		}
		if h.BoundsMS[0] != slices.Min(c.durations) || h.BoundsMS[len(h.BoundsMS)-1] != slices.Max(c.durations)+1 {
			t.Errorf("%s: bounds %v", c.t.Tool.Tool, h.BoundsMS)
		}
		want := make([]int64, len(h.Counts))
		for _, d := range c.durations {
			i, _ := slices.BinarySearch(h.BoundsMS, d+1)
			want[i-1]++
		}
		if !slices.Equal(h.Counts, want) {
			t.Errorf("%s: counts %v, want %v (bounds %v)", c.t.Tool.Tool, h.Counts, want, h.BoundsMS)
		}
		var sum int64
		for _, n := range h.Counts {
			sum += n
		}
		if sum != c.t.Sample {
			t.Errorf("%s: the histogram counts %d calls, the sample is %d", c.t.Tool.Tool, sum, c.t.Sample)
		}
	}

	// All time counts the old calls; ?tool= keeps one tool and no models.
	all := decode[server.StatsReport](t, e.do("GET", "/v1/stats?since=all&tool=fetch", nil, auth...), 200)
	if len(all.Tools) != 1 || all.Tools[0].Sample != 36 || all.Since != nil || len(all.Models) != 0 {
		t.Errorf("all of fetch: %+v", all)
	} else if h := all.Tools[0].Histogram; h.BoundsMS[len(h.BoundsMS)-1] != 9001 || h.Counts[len(h.Counts)-1] != 5 {
		t.Errorf("all of fetch: histogram %+v", h)
	}

	// A tool no call was ever recorded of is a wrong name, not "no
	// calls": the one meant is named, as `timebox stats --tool` does.
	if b := decode[apiError](t, e.do("GET", "/v1/stats?tool=fecth", nil, auth...), 400); b.Error.Code != "bad_request" ||
		!strings.Contains(b.Error.Message, `"tool": no call of a tool named "fecth" was ever recorded in this server's store (did you mean fetch?)`) {
		t.Errorf("a misspelt tool: %+v", b)
	}
	if b := decode[apiError](t, e.do("GET", "/v1/stats?since=lately", nil, auth...), 400); b.Error.Code != "bad_request" {
		t.Errorf("a bad since: %+v", b)
	}
	if b := decode[apiError](t, e.do("GET", "/v1/stats", nil), 401); b.Error.Code != "unauthorized" {
		t.Errorf("without the token: %+v", b)
	}
	mem := newEnv(t, server.Config{Agent: a, Store: store.NewMemory()})
	if b := decode[apiError](t, mem.do("GET", "/v1/stats", nil), 501); b.Error.Code != "not_implemented" {
		t.Errorf("a store without stats: %+v", b)
	}
}

func toolNames(r server.StatsReport) []string {
	var out []string
	for _, t := range r.Tools {
		out = append(out, t.Tool.Tool)
	}
	return out
}

func TestHistogramBounds(t *testing.T) {
	for _, c := range []struct {
		lo, hi int64
		want   []int64
	}{
		{0, 0, []int64{0, 1}},
		{5, 5, []int64{5, 6}},
		{1000, 1000, []int64{1000, 1001}},
		{1, 3, []int64{1, 2, 3, 4}},
		{0, 3, []int64{0, 1, 2, 3, 4}},
	} {
		if got := server.HistogramBounds(c.lo, c.hi, 20); !slices.Equal(got, c.want) {
			t.Errorf("HistogramBounds(%d, %d) = %v, want %v", c.lo, c.hi, got, c.want)
		}
	}
	for _, c := range [][2]int64{{1, 100}, {7, 400}, {250, 120000}, {0, 3600000}} {
		got := server.HistogramBounds(c[0], c[1], 20)
		if got[0] != c[0] || got[len(got)-1] != c[1]+1 || len(got) > 21 || len(got) < 10 {
			t.Errorf("HistogramBounds(%d, %d) = %v", c[0], c[1], got)
		}
		for i := 1; i < len(got); i++ {
			if got[i] <= got[i-1] {
				t.Errorf("HistogramBounds(%d, %d) = %v: not ascending", c[0], c[1], got)
			}
		}
	}
}
