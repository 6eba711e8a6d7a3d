package config

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/timebox-run/timebox/budget"
)

// WriteTable writes the resolved budget table that `timebox validate`
// prints (spec §2, §11): every tool with its timeout, where the timeout
// came from and the knob that changes it, its idle timeout and its
// enforcement; then every process-wide budget and limit with its value,
// source and knob. Columns are aligned for a terminal; the knob, the
// widest column, comes last so that the others stay readable when it
// wraps. It returns the first write error.
func WriteTable(w io.Writer, a *Agent) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tKIND\tTIMEOUT\tSOURCE\tIDLE\tENFORCEMENT\tKNOB")
	if len(a.Tools) == 0 {
		fmt.Fprintln(tw, "(none)")
	}
	for _, t := range a.Tools {
		b := t.Budget
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Name, t.Kind, fmtBudget(b.Timeout), b.Timeout.Source,
			fmtBudget(b.IdleTimeout), b.Enforcement, b.Timeout.Knob)
		if t.MCP == nil {
			continue
		}
		for _, n := range slices.Sorted(maps.Keys(t.MCP.Overrides)) {
			o := t.MCP.Overrides[n]
			timeout, idle, enf := b.Timeout, b.IdleTimeout, b.Enforcement
			if o.Timeout.Source != "" {
				timeout = o.Timeout
			}
			if o.IdleTimeout.Source != "" {
				idle = o.IdleTimeout
			}
			if o.Enforcement != "" {
				enf = o.Enforcement
			}
			fmt.Fprintf(tw, "%s[%s]\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Name, n, t.Kind, fmtBudget(timeout), timeout.Source,
				fmtBudget(idle), enf, timeout.Knob)
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if err := writeApprovals(w, a); err != nil {
		return err
	}
	if err := writeEnvironments(w, a); err != nil {
		return err
	}
	fmt.Fprintln(w)

	tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "BUDGET\tVALUE\tSOURCE\tKNOB")
	for _, s := range Settings {
		v, src, knob := settingValue(a, s)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", s.Key, s.format(v), src, knob)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if _, err := fmt.Fprintf(w, "\nprofiles: %s\n", fmtProfiles(a.Profiles)); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "request budgets (POST /v1/turns \"budgets\"): %s\n", requestCeilings(a))
	return err
}

// writeApprovals lists the tools whose calls wait for a person's decision
// (approval: required), each with how long a call waits, where that came
// from and the knob that changes it; an mcp entry's overrides are listed
// as entry[tool]. It writes nothing when no tool needs approval.
func writeApprovals(w io.Writer, a *Agent) error {
	type row struct {
		name     string
		required bool
		timeout  budget.Duration
	}
	var rows []row
	asks := false
	for _, t := range a.Tools {
		req, d := t.ApprovalFor("")
		rows = append(rows, row{t.Name, req, d})
		asks = asks || req
		if t.MCP == nil {
			continue
		}
		for _, n := range slices.Sorted(maps.Keys(t.MCP.Overrides)) {
			o := t.MCP.Overrides[n]
			if o.Approval == "" && o.ApprovalTimeout.Source == "" {
				continue // the entry's, shown on its row
			}
			req, d := t.ApprovalFor(n)
			rows = append(rows, row{fmt.Sprintf("%s[%s]", t.Name, n), req, d})
			asks = asks || req
		}
	}
	if !asks {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "\nTOOL\tAPPROVAL\tWAITS UP TO\tSOURCE\tKNOB")
	for _, r := range rows {
		if !r.required {
			fmt.Fprintf(tw, "%s\tnever\t-\t-\t-\n", r.name)
			continue
		}
		fmt.Fprintf(tw, "%s\trequired\t%s\t%s\t%s\n", r.name, fmtDuration(r.timeout.D), r.timeout.Source, r.timeout.Knob)
	}
	return tw.Flush()
}

// writeEnvironments says, by name only, what each exec tool and stdio MCP
// server inherits of timebox's environment: its env: list, or everything
// but the variables timebox withholds (Agent.Withheld).
func writeEnvironments(w io.Writer, a *Agent) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	header := false
	for _, t := range a.Tools {
		env, runs := t.Env, t.Exec != nil
		if t.MCP != nil {
			env, runs = t.MCP.Env, len(t.MCP.Command) > 0
		}
		if !runs {
			continue
		}
		if !header {
			fmt.Fprintln(tw, "\nTOOL\tINHERITS (names only; name a variable in the tool's env: to pass it)")
			header = true
		}
		var what string
		switch {
		case env == nil:
			what = "everything but " + strings.Join(a.Withheld(), ", ")
		case len(env) == 0:
			what = "nothing (env: [])"
		default:
			what = strings.Join(env, ", ")
		}
		fmt.Fprintf(tw, "%s\t%s\n", t.Name, what)
	}
	return tw.Flush()
}

// requestCeilings says how far one request's budgets may go: "turn up to
// 2h (server.request_max.turn), tool up to 60s, ..., llm_budget any".
func requestCeilings(a *Agent) string {
	var parts []string
	for _, k := range budget.Knobs {
		if !k.Request {
			continue
		}
		switch n, capKnob, unbounded := k.Ceiling(&a.Budgets, &a.Limits, a.Server.RequestMax); {
		case unbounded:
			parts = append(parts, k.Name+" any")
		case capKnob != "":
			parts = append(parts, fmt.Sprintf("%s up to %s (%s)", k.Name, k.Format(n), capKnob))
		default:
			parts = append(parts, fmt.Sprintf("%s up to %s", k.Name, k.Format(n)))
		}
	}
	return strings.Join(parts, ", ")
}

// fmtBudget renders a tool's budget: a duration, or "off".
func fmtBudget(d budget.Duration) string {
	if d.Off() {
		return "off"
	}
	return fmtDuration(d.D)
}

func fmtProfiles(p map[string]time.Duration) string {
	names := slices.Sorted(maps.Keys(p))
	parts := make([]string, len(names))
	for i, n := range names {
		parts[i] = n + " " + fmtDuration(p[n])
	}
	return strings.Join(parts, ", ")
}

// settingValue returns a resolved setting's value, source and knob.
func settingValue(a *Agent, s Setting) (int64, budget.Source, string) {
	if s.Key == KeyCompactAt {
		return int64(a.Context.CompactAt), a.Context.Source, a.Context.Knob
	}
	if s.Key == KeyTimeNotes {
		var n int64
		if a.Context.TimeNotes {
			n = 1
		}
		return n, a.Context.TimeNotesSource, a.Context.TimeNotesKnob
	}
	l := &loader{a: a}
	d, c := l.slot(s.Key)
	if d != nil {
		return int64(d.D), d.Source, d.Knob
	}
	return c.N, c.Source, c.Knob
}
