package advice_test

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/advice"
	"github.com/timebox-run/timebox/store"
)

const (
	ms = time.Millisecond
	s  = time.Second
)

func TestHuman(t *testing.T) {
	for _, tc := range []struct{ in, want time.Duration }{
		{0, 100 * ms}, {1 * ms, 100 * ms}, {100 * ms, 100 * ms}, {101 * ms, 200 * ms}, {201 * ms, 500 * ms},
		{501 * ms, s}, {1500 * ms, 2 * s}, {2100 * ms, 5 * s}, {11 * s, 15 * s}, {16 * s, 30 * s}, {31 * s, time.Minute},
		{61 * s, 2 * time.Minute}, {3 * time.Minute, 5 * time.Minute}, {11 * time.Minute, 15 * time.Minute},
		{31 * time.Minute, time.Hour}, {90 * time.Minute, 2 * time.Hour}, {30 * time.Hour, 24 * time.Hour},
	} {
		if got := advice.Human(tc.in); got != tc.want {
			t.Errorf("Human(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestSuggestTimeout is the rule of docs/decisions/timeout-advisor.md.
func TestSuggestTimeout(t *testing.T) {
	for _, tc := range []struct {
		name    string
		f       advice.Figures
		ceiling time.Duration
		want    time.Duration
		flags   []string
	}{
		{"too few calls", advice.Figures{Sample: 19, P99MS: 800, MaxOKMS: 800}, 0, 0, []string{advice.FlagTooFew}},
		{"p99 × 1.5, rounded up", advice.Figures{Sample: 20, P99MS: 800, MaxOKMS: 700}, 0, 2 * s, nil},
		{"exactly on the ladder", advice.Figures{Sample: 1000, P99MS: 1000, MaxOKMS: 1000}, 0, 2 * s, nil},
		{"the longest answer × 1.2 wins", advice.Figures{Sample: 1000, P99MS: 1000, MaxOKMS: 4500}, 0, 10 * s, nil},
		{"never below 100ms", advice.Figures{Sample: 500, P99MS: 3, MaxOKMS: 4}, 0, 100 * ms, nil},
		{"1% cut off is still the figures", advice.Figures{Sample: 1000, CutOff: 10, CutOffAtMS: 1000, P99MS: 1000, MaxOKMS: 900}, 0, 2 * s, nil},
		{"over 1% cut off: at least twice their timeout", advice.Figures{Sample: 1000, CutOff: 11, CutOffAtMS: 5000, P99MS: 1000, MaxOKMS: 900}, 0,
			10 * s, []string{advice.FlagCutOff}},
		{"cut off at an unknown timeout", advice.Figures{Sample: 1000, CutOff: 50, P99MS: 1000, MaxOKMS: 900}, 0, 2 * s, []string{advice.FlagCutOff}},
		{"twice their timeout, rounded up", advice.Figures{Sample: 100, CutOff: 30, CutOffAtMS: 3000, P99MS: 3000, MaxOKMS: 2000}, 0, 10 * s, []string{advice.FlagCutOff}},
		{"capped at tool_max", advice.Figures{Sample: 100, P99MS: 50 * 60 * 1000, MaxOKMS: 1000}, time.Hour, time.Hour, []string{advice.FlagCapped}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := advice.SuggestTimeout(tc.f, tc.ceiling)
			if got.D != tc.want || !slices.Equal(got.Flags, tc.flags) {
				t.Errorf("SuggestTimeout = %s %q, want %s %q (notes %q)", got.D, got.Flags, tc.want, tc.flags, got.Notes)
			}
			if len(got.Flags) > 0 && len(got.Notes) == 0 {
				t.Error("a flag without a note")
			}
		})
	}
}

func TestSuggestIdle(t *testing.T) {
	for _, tc := range []struct {
		name    string
		f       advice.IdleFigures
		timeout time.Duration
		want    time.Duration
		flags   []string
	}{
		{"reports no progress", advice.IdleFigures{Sample: 500, MaxSilenceMS: 900}, 5 * s, 0, nil},
		{"reports none, cut off by an idle timeout", advice.IdleFigures{Sample: 500, IdleCutOff: 500, IdleCutOffAtMS: 1000}, 5 * s, 0, []string{advice.FlagIdleCutOff}},
		{"too few report", advice.IdleFigures{Progressed: 19, Sample: 500, MaxSilenceMS: 900}, 5 * s, 0, []string{advice.FlagTooFew}},
		{"longest silence × 2", advice.IdleFigures{Progressed: 20, Sample: 20, MaxSilenceMS: 900}, time.Minute, 2 * s, nil},
		{"not shorter than the timeout", advice.IdleFigures{Progressed: 20, Sample: 20, MaxSilenceMS: 3000}, 5 * s, 0, nil},
		{"cut off for silence", advice.IdleFigures{Progressed: 100, Sample: 100, IdleCutOff: 5, IdleCutOffAtMS: 2000, MaxSilenceMS: 1000}, time.Minute,
			5 * s, []string{advice.FlagIdleCutOff}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := advice.SuggestIdle(tc.f, tc.timeout)
			if got.D != tc.want || !slices.Equal(got.Flags, tc.flags) {
				t.Errorf("SuggestIdle = %s %q, want %s %q (notes %q)", got.D, got.Flags, tc.want, tc.flags, got.Notes)
			}
		})
	}
}

// report is a report of three tools and a model endpoint, with budgets
// from an agent file.
func report() advice.Report {
	tools := []store.ToolStat{
		{Tool: "crawl", Calls: 320, Sample: 318, P50MS: 4100, P95MS: 8200, P99MS: 9900, MaxMS: 12000, MaxOKMS: 12000,
			TimeoutMS: 600000, IdleTimeoutMS: 15000, Cancelled: 2, Progressed: 318, MaxSilenceMS: 3100},
		{Tool: "web_fetch", Calls: 1240, Sample: 1238, P50MS: 420, P95MS: 1800, P99MS: 2900, MaxMS: 5003, MaxOKMS: 4700,
			TimeoutMS: 5000, CutOff: 31, CutOffTimeoutMS: 5000, TimedOut: 31, Cancelled: 2},
		{Tool: "word_count", Calls: 12, Sample: 12, P50MS: 3, P95MS: 5, P99MS: 5, MaxMS: 5, MaxOKMS: 5, TimeoutMS: 5000},
	}
	models := []store.ModelStat{
		{Endpoint: "openai:gpt-4o-mini", Phase: budget.PhaseLLMFirstChunk, Calls: 2000, Sample: 1990, P50MS: 410, P95MS: 900,
			P99MS: 1500, MaxMS: 60000, MaxOKMS: 2900, TimedOut: 3, Failed: 10},
	}
	budgets := map[string]budget.ToolBudget{
		"crawl":      {Timeout: budget.Duration{D: 10 * time.Minute, Source: budget.SourceTool, Knob: "tools[crawl].timeout in agent.yaml"}, IdleTimeout: budget.Duration{D: 15 * s}},
		"web_fetch":  {Timeout: budget.Duration{D: 5 * s, Source: budget.SourceTool, Knob: "tools[web_fetch].timeout in agent.yaml"}},
		"word_count": {Timeout: budget.Duration{D: 5 * s, Source: budget.ProfileSource("fast"), Knob: "tools[word_count].timeout in agent.yaml"}},
	}
	b := advice.Budgets{
		Tool:    func(name string) (budget.ToolBudget, bool) { tb, ok := budgets[name]; return tb, ok },
		ToolMax: time.Hour,
		Phases:  map[budget.Phase]budget.Duration{budget.PhaseLLMFirstChunk: {D: 60 * s}, budget.PhaseCompaction: {D: 60 * s}},
	}
	r := advice.NewReport("/var/lib/timebox/timebox.db", time.Date(2026, 10, 2, 9, 0, 0, 0, time.Local), tools, models, b)
	r.Agent = "agent.yaml"
	return r
}

// TestJSON: the field names `timebox stats --json` promises.
func TestJSON(t *testing.T) {
	var buf bytes.Buffer
	if err := report().WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var v struct {
		Tools  []map[string]any `json:"tools"`
		Models []map[string]any `json:"models"`
	}
	if err := json.Unmarshal(buf.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"tool", "calls", "p50_ms", "p95_ms", "p99_ms", "max_ms", "timeout_ms", "timed_out", "overran",
		"abandoned", "cancelled", "max_silence_ms", "suggested_timeout_ms", "suggested_idle_timeout_ms", "idle_timeout_ms", "flags", "notes"} {
		if _, ok := v.Tools[0][k]; !ok {
			t.Errorf("tools[0] has no %q: %v", k, v.Tools[0])
		}
	}
	for _, k := range []string{"endpoint", "phase", "calls", "p50_ms", "p95_ms", "p99_ms", "max_ms", "timeout_ms", "timed_out", "suggested_timeout_ms"} {
		if _, ok := v.Models[0][k]; !ok {
			t.Errorf("models[0] has no %q: %v", k, v.Models[0])
		}
	}
	crawl, fetch, wc := v.Tools[0], v.Tools[1], v.Tools[2]
	if crawl["suggested_timeout_ms"] != 15000.0 || crawl["suggested_idle_timeout_ms"] != 10000.0 || crawl["max_silence_ms"] != 3100.0 {
		t.Errorf("crawl: %v", crawl)
	}
	if fetch["suggested_timeout_ms"] != 10000.0 || fetch["max_silence_ms"] != nil || !strings.Contains(strings.Join(toStrings(fetch["flags"]), " "), advice.FlagCutOff) {
		t.Errorf("web_fetch: %v", fetch)
	}
	if wc["suggested_timeout_ms"] != nil || wc["timeout_source"] != "profile:fast" {
		t.Errorf("word_count: %v", wc)
	}
	if v.Models[0]["suggested_timeout_ms"] != 5000.0 || v.Models[0]["knob"] != "timeouts.llm_first_chunk" {
		t.Errorf("model: %v", v.Models[0])
	}
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

func TestText(t *testing.T) {
	var buf bytes.Buffer
	report().WriteText(&buf)
	golden(t, "report.txt", buf.String())
}

func TestTextOfNoCalls(t *testing.T) {
	var buf bytes.Buffer
	advice.NewReport("timebox.db", time.Time{}, nil, nil, advice.Budgets{}).WriteText(&buf)
	if got := buf.String(); !strings.Contains(got, "Calls at any time in timebox.db; budgets of the latest calls (no agent file read).") ||
		!strings.Contains(got, "No calls to go by") {
		t.Errorf("a report of no calls:\n%s", got)
	}
	buf.Reset()
	advice.NewReport("timebox.db", time.Time{}, nil, nil, advice.Budgets{}).WriteJSON(&buf)
	if !strings.Contains(buf.String(), `"tools": []`) || !strings.Contains(buf.String(), `"since": null`) {
		t.Errorf("a report of no calls as JSON:\n%s", buf.String())
	}
}

// TestFlagsAreASet: a tool with too few calls for both suggestions (its
// timeout's and its idle timeout's) says too_few_calls once; the notes
// say which suggestions it stands for.
func TestFlagsAreASet(t *testing.T) {
	tools := []store.ToolStat{{Tool: "rare", Calls: 3, Sample: 3, P50MS: 10, P95MS: 10, P99MS: 10, MaxMS: 10, MaxOKMS: 10,
		TimeoutMS: 5000, Progressed: 3, MaxSilenceMS: 5}}
	r := advice.NewReport("x.db", time.Now(), tools, nil, advice.Budgets{ToolMax: time.Hour})
	var buf bytes.Buffer
	if err := r.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	var v struct {
		Tools []struct {
			Flags []string `json:"flags"`
			Notes []string `json:"notes"`
		} `json:"tools"`
	}
	json.Unmarshal(buf.Bytes(), &v)
	if len(v.Tools) != 1 || !slices.Equal(v.Tools[0].Flags, []string{advice.FlagTooFew}) || len(v.Tools[0].Notes) < 2 {
		t.Errorf("%s", buf.Bytes())
	}
}

// TestInterruptedCallsAreSaidLeftOut: calls whose process or worker died
// (interrupted: a Temporal worker killed mid-call) are counted, left out
// of the figures, and the report says so — their time is how long their
// worker lived, not how long the tool takes, and no reason to raise its
// timeout.
func TestInterruptedCallsAreSaidLeftOut(t *testing.T) {
	tools := []store.ToolStat{{Tool: "crawl", Calls: 25, Sample: 22, P50MS: 900, P95MS: 1000, P99MS: 1000, MaxMS: 1000, MaxOKMS: 1000,
		TimeoutMS: 60000, Interrupted: 3}}
	r := advice.NewReport("x.db", time.Now(), tools, nil, advice.Budgets{ToolMax: time.Hour})
	notes := strings.Join(r.Tools[0].Notes, "\n")
	if !strings.Contains(notes, "3 calls were interrupted") || !strings.Contains(notes, "left out of the figures") {
		t.Errorf("notes: %q", notes)
	}
	if s := r.Tools[0].SuggestedTimeoutMS; s == nil || *s != 2000 {
		t.Errorf("suggestion %v, want 2s: the interrupted calls' time counts for nothing", s)
	}
	var buf bytes.Buffer
	r.WriteText(&buf)
	if !strings.Contains(buf.String(), "crawl: 3 calls were interrupted") {
		t.Errorf("the text report does not say so:\n%s", buf.String())
	}
}

// TestParseSinceRefusesTheFuture: a --since after now selects nothing,
// and one past 2262 wrapped the SQLite store's nanoseconds round and
// selected every call; it is refused, saying what to give.
func TestParseSinceRefusesTheFuture(t *testing.T) {
	now := time.Date(2026, 11, 28, 3, 0, 0, 0, time.UTC)
	for _, in := range []string{"2999-01-01", "2026-12-01", "2026-11-28T04:00:00Z"} {
		if _, err := advice.ParseSince(in, now); err == nil || !strings.Contains(err.Error(), "is in the future: give a date or time before now (2026-11-28 03:00)") {
			t.Errorf("%s: %v", in, err)
		}
	}
	for _, in := range []string{"2026-11-01", "7d", "90m", "0", "all", "2026-11-28T02:00:00Z"} {
		if _, err := advice.ParseSince(in, now); err != nil {
			t.Errorf("%s: %v", in, err)
		}
	}
}
