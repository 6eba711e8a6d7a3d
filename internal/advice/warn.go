package advice

import (
	"fmt"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/store"
)

// What `timebox validate` warns about (docs/decisions/timeout-advisor.md).
const (
	// MinBudget is the smallest timeout that can be right: in less, a
	// process cannot even start, nor a request get an answer.
	MinBudget = 10 * time.Millisecond
	// FarAbove and FarAboveMin: a timeout more than FarAbove times the
	// longest call of its tool, and longer than FarAboveMin, lets a hung
	// call hold its turn far longer than any call ever needed.
	FarAbove    = 10
	FarAboveMin = time.Minute
)

// NamedBudget is a tool's budget, with the tool's name.
type NamedBudget struct {
	Name   string
	Budget budget.ToolBudget
}

// Impossible returns a warning for each budget that cannot be right
// whatever the records say: a timeout or idle timeout under MinBudget.
// Each names the tool, the value and its knob.
func Impossible(tools []NamedBudget) []string {
	var out []string
	for _, t := range tools {
		for _, d := range []struct {
			key string
			v   budget.Duration
		}{{"timeout", t.Budget.Timeout}, {"idle_timeout", t.Budget.IdleTimeout}} {
			if d.v.D > 0 && d.v.D < MinBudget {
				out = append(out, fmt.Sprintf("tool %s: %s %s (%s) cannot be right: in under %s a process cannot even start nor a request be answered, so every call would be cut off; give it at least %s",
					t.Name, d.key, Format(d.v.D), knob(d.v, t.Name, d.key), Format(MinBudget), Format(Ladder[0])))
			}
		}
	}
	return out
}

// Contradicted returns a warning for each tool whose timeout the records
// of its calls contradict (stats by tool name, counted since when, zero
// for all time): below the p95 of its calls, so that one call in twenty or
// more is cut off (or overruns it); or more than FarAbove times its
// longest call and longer than FarAboveMin, so that a hung call holds its
// turn that long. Only tools with MinSample calls or more are judged.
// Each warning names the tool, the figures, the knob and what timebox
// stats suggests.
func Contradicted(tools []NamedBudget, stats map[string]store.ToolStat, since time.Time) []string {
	when := ""
	if !since.IsZero() {
		when = " since " + since.Local().Format("2006-01-02")
	}
	var out []string
	for _, t := range tools {
		st, ok := stats[t.Name]
		timeout := t.Budget.Timeout.D
		if !ok || st.Sample < MinSample || timeout <= 0 {
			continue
		}
		s := SuggestTimeout(Figures{Sample: st.Sample, CutOff: st.CutOff, CutOffAtMS: st.CutOffTimeoutMS, P99MS: st.P99MS, MaxOKMS: st.MaxOKMS}, 0)
		suggests := ""
		if s.D > 0 {
			suggests = "; timebox stats suggests " + Format(s.D)
		}
		p95 := time.Duration(st.P95MS) * time.Millisecond
		longest := time.Duration(st.MaxMS) * time.Millisecond
		switch {
		case timeout < p95:
			what := "is cut off by it"
			if t.Budget.Enforcement == budget.Advisory {
				what = "overruns it"
			}
			figure := Figure(st.P95MS)
			if figure == Format(timeout) {
				// Rounded, the p95 reads as the timeout ("1s is below
				// 1s"); to the millisecond it shows why it is above.
				figure = p95.String()
			}
			out = append(out, fmt.Sprintf("tool %s: timeout %s (%s) is below %s, the p95 of its %d calls%s: one call in twenty or more %s%s",
				t.Name, Format(timeout), knob(t.Budget.Timeout, t.Name, "timeout"), figure, st.Sample, when, what, suggests))
		case timeout > FarAbove*longest && timeout > FarAboveMin:
			out = append(out, fmt.Sprintf("tool %s: timeout %s (%s) is more than %d times the longest of its %d calls%s (%s): a hung call holds its turn %s before it is stopped%s",
				t.Name, Format(timeout), knob(t.Budget.Timeout, t.Name, "timeout"), FarAbove, st.Sample, when, Figure(st.MaxMS), Format(timeout), suggests))
		}
	}
	return out
}

// knob returns what sets a budget: its Knob, or the tool's key when the
// budget does not say (a Go tool's budget given in code).
func knob(d budget.Duration, tool, key string) string {
	if d.Knob != "" {
		return d.Knob
	}
	return fmt.Sprintf("the %s of Go tool %s, set in code", key, tool)
}
