package server

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/advice"
	"github.com/timebox-run/timebox/store"
)

// AgentBudgets is an agent that tells its resolved budgets, for GET
// /v1/stats to compare the stored calls with; *agent.Agent (and so
// *timebox.Agent) is one.
type AgentBudgets interface {
	// Budgets returns the agent's resolved turn budgets.
	Budgets() budget.Budgets
	// Tools returns the agent's tools, each with its resolved budget.
	Tools() []agent.Tool
}

// StatsReport is the response of GET /v1/stats: the report `timebox stats
// --json` prints (advice.Report, the same fields and the same suggestion
// rule), with each tool's durations as a histogram. Store is empty: the
// records are the server's own store's. Agent is the server's agent's
// name.
type StatsReport struct {
	// Store is empty: the records are the server's own store's.
	Store string `json:"store"`
	// Since is the oldest call counted (?since=, 30 days back by default);
	// nil (null) for all time.
	Since *time.Time `json:"since"`
	// Agent is the server's agent's name.
	Agent string `json:"agent"`
	// Tools are the tools' lines, and Models the model endpoints'.
	Tools  []ToolStats    `json:"tools"`
	Models []advice.Model `json:"models"`
}

// ToolStats is one tool's line of the report (advice.Tool) and its
// histogram.
type ToolStats struct {
	advice.Tool
	// Histogram counts the tool's sample by duration.
	Histogram Histogram `json:"histogram"`
}

// Histogram counts a tool's sample (the calls its percentiles are of) by
// duration: bucket i holds the calls of BoundsMS[i] ms or more and under
// BoundsMS[i+1], so BoundsMS has one more value than Counts. The bounds
// are about HistogramBuckets log-spaced values from the shortest call to
// one past the longest (fewer where whole milliseconds run out); both
// lists are empty for a tool with no sample. The counts sum to the
// tool's sample.
type Histogram struct {
	// BoundsMS (bounds_ms) are the buckets' bounds in milliseconds, and
	// Counts the calls in each bucket.
	BoundsMS []int64 `json:"bounds_ms"`
	Counts   []int64 `json:"counts"`
}

// HistogramBuckets is how many buckets a tool's histogram has, at most.
const HistogramBuckets = 20

// defaultStatsSince is how far back GET /v1/stats looks without ?since=,
// as `timebox stats` does.
const defaultStatsSince = "30d"

func (s *Server) getStats(w http.ResponseWriter, r *http.Request) {
	cs, ok := s.cfg.Store.(store.CallStats)
	if !ok {
		writeError(w, http.StatusNotImplemented, "not_implemented",
			"this server's store does not sum up its calls: stats need a SQLite or PostgreSQL store (timebox serve --db)")
		return
	}
	q := r.URL.Query()
	sinceText := q.Get("since")
	if sinceText == "" {
		sinceText = defaultStatsSince
	}
	since, err := advice.ParseSince(sinceText, time.Now())
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf(`"since" is %s: %v`, shown(strconv.Quote(sinceText)), err))
		return
	}
	f := store.StatsFilter{Since: since, Tool: q.Get("tool")}
	ctx := r.Context()
	tools, err := cs.ToolStats(ctx, f)
	if err != nil {
		s.storeFailed(w, r, err, "the call stats")
		return
	}
	if len(tools) == 0 && f.Tool != "" && len(f.Tool) <= 256 { // no tool's name is longer; nor is what an answer repeats
		problem, err := advice.UnknownTool(ctx, cs, "this server's store", f.Tool)
		switch {
		case err != nil:
			s.storeFailed(w, r, err, "the call stats")
			return
		case problem != "":
			writeError(w, http.StatusBadRequest, "bad_request", `"tool": `+problem)
			return
		}
	}
	models, err := cs.ModelStats(ctx, f)
	if err != nil {
		s.storeFailed(w, r, err, "the call stats")
		return
	}
	rep := advice.NewReport("", since, tools, models, s.statsBudgets())
	out := StatsReport{Since: rep.Since, Agent: s.cfg.AgentName, Tools: make([]ToolStats, len(rep.Tools)), Models: rep.Models}
	for i, t := range rep.Tools {
		h, err := histogram(ctx, cs, f, tools[i])
		if err != nil {
			s.storeFailed(w, r, err, "the call stats")
			return
		}
		out.Tools[i] = ToolStats{Tool: t, Histogram: h}
	}
	writeJSON(w, http.StatusOK, out)
}

// statsBudgets returns the agent's budgets for the report: Config.Budgets,
// else the Agent's own when it tells them; none otherwise (a tool's
// budget is then its latest call's).
func (s *Server) statsBudgets() advice.Budgets {
	ab := s.cfg.Budgets
	if ab == nil {
		ab, _ = s.cfg.Agent.(AgentBudgets)
	}
	if ab == nil {
		return advice.Budgets{}
	}
	b := ab.Budgets()
	byName := map[string]budget.ToolBudget{}
	for _, t := range ab.Tools() {
		byName[t.Tool.Spec().Name] = t.Budget
	}
	return advice.Budgets{
		ToolMax: b.ToolMax.D,
		Phases: map[budget.Phase]budget.Duration{
			budget.PhaseLLMFirstChunk: b.LLMFirstChunk,
			budget.PhaseCompaction:    b.Compaction,
		},
		Tool: func(name string) (budget.ToolBudget, bool) {
			tb, ok := byName[name]
			return tb, ok
		},
	}
}

// histogram counts t's sample in the store (CallStats.ToolHistogram) by
// the bounds of HistogramBounds.
func histogram(ctx context.Context, cs store.CallStats, f store.StatsFilter, t store.ToolStat) (Histogram, error) {
	h := Histogram{BoundsMS: []int64{}, Counts: []int64{}}
	if t.Sample == 0 {
		return h, nil
	}
	bounds := HistogramBounds(t.MinMS, t.MaxMS, HistogramBuckets)
	counts, err := cs.ToolHistogram(ctx, f, t.Tool, bounds[1:len(bounds)-1])
	if err != nil {
		return h, err
	}
	h.BoundsMS, h.Counts = bounds, counts
	return h, nil
}

// HistogramBounds returns the edges of at most n buckets spanning
// [lo, hi] in whole milliseconds: lo, then values spaced evenly on a log
// scale, then hi+1, strictly ascending (buckets narrower than a
// millisecond are merged). A log scale, because a tool's durations spread
// over orders of magnitude: a fast common case and a slow tail.
func HistogramBounds(lo, hi int64, n int) []int64 {
	lo, hi = max(lo, 0), max(hi, lo)
	end := hi + 1
	bounds := []int64{lo}
	from := float64(max(lo, 1))
	ratio := float64(end) / from
	for i := 1; i < n; i++ {
		e := int64(math.Round(from * math.Pow(ratio, float64(i)/float64(n))))
		if e > bounds[len(bounds)-1] && e < end {
			bounds = append(bounds, e)
		}
	}
	return append(bounds, end)
}
