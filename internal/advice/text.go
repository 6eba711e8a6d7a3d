package advice

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteJSON writes the report as `timebox stats --json` does: one JSON
// object, {"store": …, "since": …, "tools": [{"tool": …, "calls": …,
// "p50_ms": …}], "models": [...]}.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for a person: a table of tools, their notes,
// a table of model endpoints and theirs.
func (r Report) WriteText(w io.Writer) {
	when := "at any time"
	if r.Since != nil {
		when = "since " + r.Since.Local().Format("2006-01-02 15:04")
	}
	budgets := "budgets of the latest calls (no agent file read)"
	if r.Agent != "" {
		budgets = "budgets from " + r.Agent
	}
	fmt.Fprintf(w, "Calls %s in %s; %s.\n", when, r.Store, budgets)
	if len(r.Tools) == 0 && len(r.Models) == 0 {
		fmt.Fprintln(w, "\nNo calls to go by: run some turns first, or widen --since.")
		return
	}
	if len(r.Tools) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "TOOL\tCALLS\tP50\tP95\tP99\tMAX\tTIMEOUT\tTIMED OUT\tOVERRAN\tABANDONED\tCANCELLED\tSILENCE\tIDLE\tSUGGEST\tSUGGEST IDLE")
		for _, t := range r.Tools {
			timeout := budgetText(t.TimeoutMS)
			if t.TimeoutSource != "" {
				timeout += " (" + t.TimeoutSource + ")"
			}
			silence := "-"
			if t.MaxSilenceMS != nil {
				silence = Figure(*t.MaxSilenceMS)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Tool, t.Calls,
				figureOrDash(t.Sample, t.P50MS), figureOrDash(t.Sample, t.P95MS), figureOrDash(t.Sample, t.P99MS), figureOrDash(t.Sample, t.MaxMS),
				timeout, count(t.TimedOut), count(t.Overran), count(t.Abandoned), count(t.Cancelled), silence, budgetText(t.IdleTimeoutMS),
				orDash(t.SuggestedTimeout), orDash(t.SuggestedIdleTimeout))
		}
		tw.Flush()
		for _, t := range r.Tools {
			writeNotes(w, t.Tool, t.Notes)
		}
	}
	if len(r.Models) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
		fmt.Fprintln(tw, "MODEL\tPHASE\tCALLS\tP50\tP95\tP99\tMAX\tTIMEOUT\tTIMED OUT\tFAILED\tCANCELLED\tSUGGEST")
		for _, m := range r.Models {
			timeout := "?"
			if m.TimeoutMS > 0 {
				timeout = Format(time.Duration(m.TimeoutMS) * time.Millisecond)
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.Endpoint, m.Phase, m.Calls,
				figureOrDash(m.Sample, m.P50MS), figureOrDash(m.Sample, m.P95MS), figureOrDash(m.Sample, m.P99MS), figureOrDash(m.Sample, m.MaxMS),
				timeout, count(m.TimedOut), count(m.Failed), count(m.Cancelled), orDash(m.SuggestedTimeout))
		}
		tw.Flush()
		for _, m := range r.Models {
			writeNotes(w, m.Endpoint+" "+string(m.Phase), m.Notes)
		}
		fmt.Fprintln(w, "\nA model phase's timeout is one value for every model (the knobs timeouts.llm_first_chunk and timeouts.compaction): take the largest suggestion of the endpoints you use. --apply does not change them.")
	}
	fmt.Fprintln(w, "\nPercentiles are of the calls that ended on their own or by their own budget; a call cut off by its timeout counts as long as it ran, although it would have taken longer. SILENCE is the longest time a call went without reporting progress, for tools that report it.")
	if r.Agent != "" && r.changes() {
		fmt.Fprintf(w, "timebox stats --apply -f %s writes the suggestions into the agent file (--dry-run shows the change first).\n", r.Agent)
	}
}

// changes reports whether a suggestion differs from a tool's budget.
func (r Report) changes() bool {
	for _, t := range r.Tools {
		if t.SuggestedTimeoutMS != nil && *t.SuggestedTimeoutMS != t.TimeoutMS ||
			t.SuggestedIdleTimeoutMS != nil && *t.SuggestedIdleTimeoutMS != t.IdleTimeoutMS {
			return true
		}
	}
	return false
}

func writeNotes(w io.Writer, who string, notes []string) {
	for _, n := range notes {
		fmt.Fprintf(w, "  %s: %s.\n", who, strings.TrimSuffix(n, "."))
	}
}

func figureOrDash(n, ms int64) string {
	if n == 0 {
		return "-"
	}
	return Figure(ms)
}

func budgetText(ms int64) string {
	if ms <= 0 {
		return "-"
	}
	return Format(time.Duration(ms) * time.Millisecond)
}

func count(n int64) string {
	if n == 0 {
		return "-"
	}
	return strconv.FormatInt(n, 10)
}

func orDash(s *string) string {
	if s == nil {
		return "-"
	}
	return *s
}
