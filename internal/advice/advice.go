// Package advice turns what a store sums up of past calls
// (store.CallStats) into budgets: the rule that suggests a tool's timeout
// and idle timeout, and a model phase's timeout
// (docs/decisions/timeout-advisor.md); the report `timebox stats` prints,
// as text or JSON; the edit of the agent file that `timebox stats --apply`
// makes; and the warnings of `timebox validate`. It is one place for every
// store: SQLite and PostgreSQL only count.
package advice

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/store"
)

// The suggestion rule (docs/decisions/timeout-advisor.md).
const (
	// MinSample is the fewest calls a suggestion is made from: with fewer,
	// a p99 is the longest call or close to it, and one slow call moves it.
	MinSample = 20
	// Headroom multiplies the p99: one call in a hundred takes longer than
	// it, and the tool's next week is not its last one.
	Headroom = 1.5
	// OKMargin multiplies the longest call that answered: a timeout that
	// would have cut off a call that answered is too short.
	OKMargin = 1.2
	// CutOffShare is the share of calls cut off by their own budget above
	// which the figures are taken to say too little: their true durations
	// are unknown (at least the timeout), so the suggestion is at least
	// twice the timeout.
	CutOffShare = 0.01
	// IdleHeadroom multiplies the longest silence between progress reports.
	IdleHeadroom = 2
)

// Ladder are the values a suggestion is rounded up to: what a person
// would write. A suggestion is never below the first.
var Ladder = []time.Duration{
	100 * time.Millisecond, 200 * time.Millisecond, 500 * time.Millisecond,
	time.Second, 2 * time.Second, 5 * time.Second, 10 * time.Second, 15 * time.Second, 30 * time.Second,
	time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 15 * time.Minute, 30 * time.Minute,
	time.Hour, 2 * time.Hour, 4 * time.Hour, 8 * time.Hour, 12 * time.Hour, 24 * time.Hour,
}

// Human returns the smallest value of the Ladder at or above d; the
// Ladder's last above it.
func Human(d time.Duration) time.Duration {
	for _, v := range Ladder {
		if v >= d {
			return v
		}
	}
	return Ladder[len(Ladder)-1]
}

// Flags of a suggestion, for programs reading --json.
const (
	// FlagTooFew: fewer than MinSample calls; no suggestion.
	FlagTooFew = "too_few_calls"
	// FlagCutOff: more than CutOffShare of the calls were cut off by their
	// timeout ("calls are being cut off").
	FlagCutOff = "calls_cut_off"
	// FlagIdleCutOff: the same, by their idle timeout.
	FlagIdleCutOff = "calls_cut_off_idle"
	// FlagCapped: the rule asked for more than the largest timeout
	// allowed (timeouts.tool_max), which the suggestion is.
	FlagCapped = "capped"
	// FlagProfile: the tool's timeout is a profile's, which --apply leaves
	// as it is.
	FlagProfile = "profile"
)

// Suggestion is a suggested budget, or none (D 0), with why.
type Suggestion struct {
	D     time.Duration
	Flags []string
	Notes []string
}

func (s *Suggestion) note(flag, format string, args ...any) {
	if flag != "" {
		s.Flags = append(s.Flags, flag)
	}
	s.Notes = append(s.Notes, fmt.Sprintf(format, args...))
}

// Figures are what a timeout is suggested from (milliseconds).
type Figures struct {
	// Sample counts the calls the percentiles are of; CutOff those of
	// them their timeout ended, and CutOffAtMS the largest timeout they
	// were cut off at (0 when unknown).
	Sample, CutOff, CutOffAtMS int64
	P99MS                      int64
	// MaxOKMS is the longest call that answered.
	MaxOKMS int64
}

// SuggestTimeout applies the rule: the p99 times Headroom, at least the
// longest call that answered times OKMargin, rounded up to a Human value;
// when more than CutOffShare of the calls were cut off by their timeout,
// at least twice the timeout they were cut off at (their true durations
// are unknown); at most ceiling (0: no ceiling). No suggestion from fewer
// than MinSample calls. The timeout of the calls, not the one now, sets
// the floor, so that a suggestion once applied is suggested again until
// new calls say otherwise.
func SuggestTimeout(f Figures, ceiling time.Duration) Suggestion {
	var s Suggestion
	if f.Sample < MinSample {
		s.note(FlagTooFew, "only %d call%s to go by; a suggestion needs at least %d", f.Sample, plural(f.Sample), MinSample)
		return s
	}
	want := max(scale(f.P99MS, Headroom), scale(f.MaxOKMS, OKMargin))
	if cutOff(f.CutOff, f.Sample) {
		share := 100 * float64(f.CutOff) / float64(f.Sample)
		if at := time.Duration(f.CutOffAtMS) * time.Millisecond; at > 0 {
			want = max(want, 2*at)
			s.note(FlagCutOff, "calls are being cut off: %d of %d (%.1f%%) were stopped by the timeout (%s); how long they would have taken is unknown, so the suggestion is at least twice that",
				f.CutOff, f.Sample, share, Format(at))
		} else {
			s.note(FlagCutOff, "calls are being cut off: %d of %d (%.1f%%) were stopped by their timeout; how long they would have taken is unknown, so the suggestion may still be short",
				f.CutOff, f.Sample, share)
		}
	}
	s.D = Human(want)
	if ceiling > 0 && s.D > ceiling {
		s.D = ceiling
		s.note(FlagCapped, "the rule asks for %s, above timeouts.tool_max (%s), the largest timeout a tool may have: raise it too, or find out why the calls take so long",
			Format(Human(want)), Format(ceiling))
	}
	return s
}

// IdleFigures are what an idle timeout is suggested from.
type IdleFigures struct {
	// Progressed counts the calls that reported progress; Sample all the
	// calls measured, IdleCutOff those an idle timeout ended, and
	// IdleCutOffAtMS the largest idle timeout they were cut off at.
	Progressed, Sample, IdleCutOff, IdleCutOffAtMS int64
	// MaxSilenceMS is the longest silence of a call (store.ToolStat).
	MaxSilenceMS int64
}

// SuggestIdle applies the idle rule: for a tool that reports progress, the
// longest silence of its calls times IdleHeadroom, rounded up to a Human
// value; at least twice the idle timeout calls were cut off at when more
// than CutOffShare of them were; none when it would not be shorter than
// timeout (it could never fire), from fewer than MinSample calls that
// reported progress, or for a tool that never reported any.
func SuggestIdle(f IdleFigures, timeout time.Duration) Suggestion {
	var s Suggestion
	at := time.Duration(f.IdleCutOffAtMS) * time.Millisecond
	switch {
	case f.Progressed == 0:
		if f.IdleCutOff > 0 {
			s.note(FlagIdleCutOff, "%d call%s stopped by the idle timeout (%s) before reporting any progress: the tool reports none, so its idle timeout only cuts it off; remove it",
				f.IdleCutOff, plural(f.IdleCutOff)+were(f.IdleCutOff), Format(at))
		}
		return s
	case f.Progressed < MinSample:
		s.note(FlagTooFew, "only %d call%s reported progress; an idle timeout suggestion needs at least %d", f.Progressed, plural(f.Progressed), MinSample)
		return s
	}
	want := scale(f.MaxSilenceMS, IdleHeadroom)
	if cutOff(f.IdleCutOff, f.Sample) && at > 0 {
		want = max(want, 2*at)
		s.note(FlagIdleCutOff, "calls are being cut off for silence: %d of %d were stopped by the idle timeout (%s), so the suggestion is at least twice it",
			f.IdleCutOff, f.Sample, Format(at))
	}
	d := Human(want)
	if timeout > 0 && d >= timeout {
		s.note("", "its longest silence (%s) is close to the whole call: an idle timeout (%s) would not be shorter than the timeout (%s), so it could never fire",
			Figure(f.MaxSilenceMS), Format(d), Format(timeout))
		return s
	}
	s.D = d
	return s
}

func cutOff(n, of int64) bool { return of > 0 && float64(n) > CutOffShare*float64(of) }

// scale returns ms×k as a duration, whole milliseconds rounded up.
func scale(ms int64, k float64) time.Duration {
	return time.Duration(math.Ceil(float64(ms)*k)) * time.Millisecond
}

// Format writes a budget as the agent file does: 500ms, 2s, 60s, 5m, 2h.
func Format(d time.Duration) string { return budget.FormatDuration(d) }

// Figure writes a measured duration for a person: 420ms, 1.8s, 2m31s.
func Figure(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	switch {
	case d < time.Second:
		return d.String()
	case d < time.Minute:
		s := fmt.Sprintf("%.1fs", d.Seconds())
		if s[len(s)-3:] == ".0s" {
			s = s[:len(s)-3] + "s"
		}
		return s
	}
	return budget.FormatDuration(d.Round(time.Second))
}

func plural(n int64) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func were(n int64) string {
	if n == 1 {
		return " was"
	}
	return " were"
}

// Tool is one tool's line of the report: what the store counted
// (store.ToolStat), its budget, and the suggestion. Durations are
// milliseconds; the JSON names are those `timebox stats --json` prints.
type Tool struct {
	Tool string `json:"tool"`
	// Calls counts the calls that ran; Sample those the percentiles are
	// of (store.ToolSample).
	Calls  int64 `json:"calls"`
	Sample int64 `json:"sample"`
	P50MS  int64 `json:"p50_ms"`
	P95MS  int64 `json:"p95_ms"`
	P99MS  int64 `json:"p99_ms"`
	MaxMS  int64 `json:"max_ms"`
	// MaxOKMS is the longest call that answered.
	MaxOKMS int64 `json:"max_ok_ms"`
	// TimeoutMS is the tool's timeout now: the agent file's when one was
	// read (TimeoutSource and Knob say where it comes from and what sets
	// it), else the latest call's.
	TimeoutMS     int64  `json:"timeout_ms"`
	TimeoutSource string `json:"timeout_source"`
	Knob          string `json:"knob"`
	// IdleTimeoutMS is its idle timeout; 0 is off.
	IdleTimeoutMS int64 `json:"idle_timeout_ms"`
	TimedOut      int64 `json:"timed_out"`
	IdleTimedOut  int64 `json:"idle_timed_out"`
	Overran       int64 `json:"overran"`
	Abandoned     int64 `json:"abandoned"`
	Cancelled     int64 `json:"cancelled"`
	Interrupted   int64 `json:"interrupted"`
	// CutOff counts the calls of the sample their own budget ended.
	CutOff int64 `json:"cut_off"`
	// Progressed counts the calls that reported progress; MaxSilenceMS is
	// the longest silence between progress reports (from the call's start,
	// and to its end) of a call, null for a tool that reports none.
	Progressed   int64  `json:"progressed"`
	MaxSilenceMS *int64 `json:"max_silence_ms"`
	// SuggestedTimeoutMS and SuggestedIdleTimeoutMS are the suggestions,
	// null when there is none; SuggestedTimeout and SuggestedIdleTimeout
	// the same as the agent file writes them.
	SuggestedTimeoutMS     *int64  `json:"suggested_timeout_ms"`
	SuggestedTimeout       *string `json:"suggested_timeout"`
	SuggestedIdleTimeoutMS *int64  `json:"suggested_idle_timeout_ms"`
	SuggestedIdleTimeout   *string `json:"suggested_idle_timeout"`
	// Flags are the Flag… constants that apply; Notes say why, in
	// sentences.
	Flags []string `json:"flags"`
	Notes []string `json:"notes"`
}

// Model is one model endpoint's line of the report for one phase.
type Model struct {
	// Endpoint is "provider:model"; Phase the budget its attempts are
	// measured against (store.ModelStat).
	Endpoint string       `json:"endpoint"`
	Phase    budget.Phase `json:"phase"`
	Calls    int64        `json:"calls"`
	Sample   int64        `json:"sample"`
	P50MS    int64        `json:"p50_ms"`
	P95MS    int64        `json:"p95_ms"`
	P99MS    int64        `json:"p99_ms"`
	MaxMS    int64        `json:"max_ms"`
	MaxOKMS  int64        `json:"max_ok_ms"`
	// TimeoutMS is the phase's budget in the agent file read; 0 when none
	// was read. Knob is the key that sets it, for every endpoint at once.
	TimeoutMS          int64    `json:"timeout_ms"`
	Knob               string   `json:"knob"`
	TimedOut           int64    `json:"timed_out"`
	IdleTimedOut       int64    `json:"idle_timed_out"`
	Failed             int64    `json:"failed"`
	Cancelled          int64    `json:"cancelled"`
	SuggestedTimeoutMS *int64   `json:"suggested_timeout_ms"`
	SuggestedTimeout   *string  `json:"suggested_timeout"`
	Flags              []string `json:"flags"`
	Notes              []string `json:"notes"`
}

// Report is what `timebox stats` prints.
type Report struct {
	// Store is where the records were read (no password); Since the
	// oldest call counted, nil for all; Agent the agent file whose budgets
	// are compared, empty when none was read.
	Store  string     `json:"store"`
	Since  *time.Time `json:"since"`
	Agent  string     `json:"agent"`
	Tools  []Tool     `json:"tools"`
	Models []Model    `json:"models"`
}

// Budgets are the budgets of the agent file, for the report to compare
// the calls with. The zero Budgets is no agent file: a tool's timeout is
// then its latest call's.
type Budgets struct {
	// Tool returns the budget of the tool named so, and false for a tool
	// the agent file does not declare.
	Tool func(name string) (budget.ToolBudget, bool)
	// ToolMax is timeouts.tool_max, the ceiling of a tool's suggestion; 0
	// is none.
	ToolMax time.Duration
	// Phases are the budgets of the model phases (llm_first_chunk,
	// compaction).
	Phases map[budget.Phase]budget.Duration
}

// phaseKnobs name what sets each model phase's budget.
var phaseKnobs = map[budget.Phase]string{
	budget.PhaseLLMFirstChunk: "timeouts.llm_first_chunk",
	budget.PhaseCompaction:    "timeouts.compaction",
}

// NewTool returns a tool's line of the report from its figures and, when
// the agent file declares it, its budget there.
func NewTool(st store.ToolStat, b Budgets) Tool {
	t := Tool{Tool: st.Tool, Calls: st.Calls, Sample: st.Sample, P50MS: st.P50MS, P95MS: st.P95MS, P99MS: st.P99MS,
		MaxMS: st.MaxMS, MaxOKMS: st.MaxOKMS, TimeoutMS: st.TimeoutMS, IdleTimeoutMS: st.IdleTimeoutMS,
		TimedOut: st.TimedOut, IdleTimedOut: st.IdleTimedOut, Overran: st.Overran, Abandoned: st.Abandoned,
		Cancelled: st.Cancelled, Interrupted: st.Interrupted, CutOff: st.CutOff, Progressed: st.Progressed,
		Flags: []string{}, Notes: []string{}}
	if st.Progressed > 0 {
		gap := st.MaxSilenceMS
		t.MaxSilenceMS = &gap
	}
	if b.Tool != nil {
		if tb, ok := b.Tool(st.Tool); ok {
			t.TimeoutMS, t.TimeoutSource, t.Knob = tb.Timeout.D.Milliseconds(), string(tb.Timeout.Source), tb.Timeout.Knob
			t.IdleTimeoutMS = tb.IdleTimeout.D.Milliseconds()
		} else {
			t.Notes = append(t.Notes, "not declared in the agent file (a Go tool, or one since renamed or removed): its budget is that of its latest call")
		}
	}
	// A lost worker's call says how long the worker lived: no reason to
	// raise a timeout (store.ToolSample leaves it out).
	switch n := st.Interrupted; {
	case n == 1:
		t.Notes = append(t.Notes, "1 call was interrupted — the process or Temporal worker running it died — and is left out of the figures: the time it ran says how long its worker lived, not how long the tool takes")
	case n > 1:
		t.Notes = append(t.Notes, fmt.Sprintf("%d calls were interrupted — the process or Temporal worker running them died — and are left out of the figures: the time they ran says how long their worker lived, not how long the tool takes", n))
	}
	current := time.Duration(t.TimeoutMS) * time.Millisecond
	s := SuggestTimeout(Figures{Sample: st.Sample, CutOff: st.CutOff, CutOffAtMS: st.CutOffTimeoutMS, P99MS: st.P99MS, MaxOKMS: st.MaxOKMS}, b.ToolMax)
	t.Flags, t.Notes = append(t.Flags, s.Flags...), append(t.Notes, s.Notes...)
	t.SuggestedTimeoutMS, t.SuggestedTimeout = suggested(s.D)
	timeout := s.D
	if timeout == 0 {
		timeout = current
	}
	idle := SuggestIdle(IdleFigures{Progressed: st.Progressed, Sample: st.Sample, IdleCutOff: st.IdleCutOff,
		IdleCutOffAtMS: st.IdleCutOffTimeoutMS, MaxSilenceMS: st.MaxSilenceMS}, timeout)
	t.Notes = append(t.Notes, idle.Notes...)
	for _, f := range idle.Flags {
		if !slices.Contains(t.Flags, f) { // a flag is a set: the notes say which suggestion it was
			t.Flags = append(t.Flags, f)
		}
	}
	t.SuggestedIdleTimeoutMS, t.SuggestedIdleTimeout = suggested(idle.D)
	if profile, ok := strings.CutPrefix(t.TimeoutSource, "profile:"); ok && s.D > 0 && s.D != current {
		t.Flags = append(t.Flags, FlagProfile)
		t.Notes = append(t.Notes, fmt.Sprintf("its timeout is the profile %s (%s), which other tools may share: --apply leaves it; change timeouts.profiles.%[1]s, or give the tool a timeout of its own",
			profile, Format(current)))
	}
	return t
}

// NewModel returns a model endpoint's line of the report for one phase.
func NewModel(st store.ModelStat, b Budgets) Model {
	m := Model{Endpoint: st.Endpoint, Phase: st.Phase, Calls: st.Calls, Sample: st.Sample, P50MS: st.P50MS, P95MS: st.P95MS,
		P99MS: st.P99MS, MaxMS: st.MaxMS, MaxOKMS: st.MaxOKMS, Knob: phaseKnobs[st.Phase], TimedOut: st.TimedOut,
		IdleTimedOut: st.IdleTimedOut, Failed: st.Failed, Cancelled: st.Cancelled, Flags: []string{}, Notes: []string{}}
	// A model call's record does not keep its budget: the one it was cut
	// off at is taken to be the agent file's.
	current := b.Phases[st.Phase].D
	m.TimeoutMS = current.Milliseconds()
	s := SuggestTimeout(Figures{Sample: st.Sample, CutOff: st.TimedOut, CutOffAtMS: m.TimeoutMS, P99MS: st.P99MS, MaxOKMS: st.MaxOKMS}, 0)
	m.Flags, m.Notes = append(m.Flags, s.Flags...), append(m.Notes, s.Notes...)
	m.SuggestedTimeoutMS, m.SuggestedTimeout = suggested(s.D)
	if st.IdleTimedOut > 0 {
		m.Notes = append(m.Notes, fmt.Sprintf("%d stream%s went silent past timeouts.llm_idle after %s; the silences between chunks are not recorded, so there is no suggestion for it",
			st.IdleTimedOut, plural(st.IdleTimedOut), map[bool]string{true: "it began", false: "they began"}[st.IdleTimedOut == 1]))
	}
	return m
}

// suggested returns a suggestion as the report gives it: milliseconds and
// the agent file's form, nil when there is none.
func suggested(d time.Duration) (*int64, *string) {
	if d <= 0 {
		return nil, nil
	}
	ms, text := d.Milliseconds(), Format(d)
	return &ms, &text
}

// NewReport returns the report of the figures a store gave.
func NewReport(where string, since time.Time, tools []store.ToolStat, models []store.ModelStat, b Budgets) Report {
	r := Report{Store: where, Tools: []Tool{}, Models: []Model{}}
	if !since.IsZero() {
		r.Since = &since
	}
	for _, t := range tools {
		r.Tools = append(r.Tools, NewTool(t, b))
	}
	for _, m := range models {
		r.Models = append(r.Models, NewModel(m, b))
	}
	return r
}
