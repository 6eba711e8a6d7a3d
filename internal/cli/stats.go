package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/config"
	"github.com/timebox-run/timebox/internal/advice"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/store/sqlite"
	"github.com/timebox-run/timebox/tool"
)

const statsUsage = `usage:
  timebox stats [--db STORE] [--since 30d] [--tool NAME] [--json] [-f agent.yaml]
  timebox stats --apply [--dry-run] [-f agent.yaml] [--db STORE] [--since 30d] [--tool NAME]

Reads the call records of the store and prints, per tool and per model
endpoint and phase: calls, p50/p95/p99/max, the budget, how many calls timed
out, overran, were abandoned or cancelled, the longest silence between
progress reports, and a suggested timeout and idle_timeout
(docs/stats.md; the rule: docs/decisions/timeout-advisor.md).

--apply writes the suggested timeouts into the agent file, keeping its
comments and layout, and prints the change as a diff; --dry-run prints it
only. The agent file is -f, else agent.yaml when there is one here.

The store is --db, else TIMEBOX_DB, else the default store of every command
(timebox.db in $XDG_STATE_HOME/timebox, ~/.local/state/timebox).

Flags:`

// defaultStatsSince is how far back stats and validate look by default:
// long enough for a tool used once a week, short enough that a tool
// changed a month ago is judged by what it does now.
const defaultStatsSince = 30 * 24 * time.Hour

func cmdStats(ctx context.Context, args []string, o IO) int {
	fs, c := newFlags("stats", o)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), statsUsage)
		printFlags(fs, "stats")
	}
	dbFlag := fs.String("db", "", "the store: a SQLite file or a postgres:// URL (env TIMEBOX_DB; default "+stateDB(o)+")")
	sinceFlag := fs.String("since", "30d", "the calls of this long ago and later: 7d, 12h, a date (2026-10-01), or 0 for all")
	toolFlag := fs.String("tool", "", "only this tool (and no model endpoints)")
	asJSON := fs.Bool("json", false, `print JSON: {"tools": [{"tool": …, "calls": …, "p50_ms": …}], "models": [...]}`)
	apply := fs.Bool("apply", false, "write the suggested timeouts into the agent file and print the diff")
	dryRun := fs.Bool("dry-run", false, "with --apply: print the diff, change nothing")
	pos, err := parse(fs, args)
	if err != nil {
		return usageExit(err)
	}
	if len(pos) > 0 {
		fmt.Fprintf(o.Err, "timebox stats: unexpected argument %q (a tool is given with --tool)\n", pos[0])
		return ExitUsage
	}
	since, err := parseSince(*sinceFlag, time.Now())
	if err != nil {
		fmt.Fprintf(o.Err, "timebox stats: --since %q: %v\n", *sinceFlag, err)
		return ExitUsage
	}
	switch {
	case *dryRun && !*apply:
		fmt.Fprintln(o.Err, "timebox stats: --dry-run goes with --apply")
		return ExitUsage
	case *apply && *asJSON:
		fmt.Fprintln(o.Err, "timebox stats: --apply prints a diff; leave out --json")
		return ExitUsage
	}

	// The agent file: -f, or agent.yaml when there is one here.
	var cfg *config.Agent
	if _, err := os.Stat(c.file); err == nil || flagSet(fs, "f") || *apply {
		var ok bool
		if cfg, ok = loadConfig(c, fs, o); !ok {
			return ExitUsage
		}
	}

	db := setting(fs, "db", *dbFlag, "TIMEBOX_DB", o, stateDB(o))
	ended, traced := readerEnds(ctx, o, "stats")
	defer traced()
	st, where, code := openStatsStore(db, o, ended)
	if st == nil {
		return code
	}
	defer st.Close()
	cs := st.(store.CallStats)
	f := store.StatsFilter{Since: since, Tool: *toolFlag}
	tools, err := cs.ToolStats(ctx, f)
	if err != nil {
		fmt.Fprintln(o.Err, "timebox stats:", err)
		return ExitFailed
	}
	if len(tools) == 0 {
		problem, err := advice.UnknownTool(ctx, cs, where, *toolFlag)
		switch {
		case err != nil:
			fmt.Fprintln(o.Err, "timebox stats:", err)
			return ExitFailed
		case problem != "":
			fmt.Fprintln(o.Err, "timebox stats: --tool:", problem)
			return ExitUsage
		}
	}
	models, err := cs.ModelStats(ctx, f)
	if err != nil {
		fmt.Fprintln(o.Err, "timebox stats:", err)
		return ExitFailed
	}
	r := advice.NewReport(where, since, tools, models, budgetsOf(cfg))
	if cfg != nil {
		r.Agent = c.file
	}
	switch {
	case *apply:
		return applySuggestions(r, c, fs, *dryRun, o)
	case *asJSON:
		if err := r.WriteJSON(o.Out); err != nil {
			fmt.Fprintln(o.Err, "timebox stats:", err)
			return ExitFailed
		}
	default:
		r.WriteText(o.Out)
	}
	return ExitOK
}

// parseSince reads --since (advice.ParseSince, which GET /v1/stats
// shares).
func parseSince(s string, now time.Time) (time.Time, error) { return advice.ParseSince(s, now) }

// openStatsStore opens the store stats reads — as runs opens it: a store
// that cannot be written is read without writing — and returns where it
// is, for messages. It never creates one: a SQLite file that is not there
// is an error (ExitFailed).
func openStatsStore(db string, o IO, ended func(store.Ending)) (store.Store, string, int) {
	if db == "" {
		fmt.Fprintln(o.Err, `timebox stats: --db is "": name the store`)
		return nil, "", ExitUsage
	}
	where := storeName(db)
	if _, err := os.Stat(sqlitePath(db)); !postgres.IsURL(db) && errors.Is(err, os.ErrNotExist) {
		fmt.Fprintf(o.Err, "timebox stats: no store at %s: nothing was stored there yet (timebox run and timebox serve store their calls in %s unless --db or TIMEBOX_DB names another store)\n",
			where, stateDB(o))
		return nil, "", ExitFailed
	}
	st, err := openStore(db, false, o, ended)
	if err != nil && !postgres.IsURL(db) {
		var rerr error
		if st, rerr = sqlite.OpenReadOnly(sqlitePath(db)); rerr == nil {
			fmt.Fprintf(o.Err, "timebox stats: %v; reading it without writing\n", err)
			err = nil
		}
	}
	if err != nil {
		fmt.Fprintln(o.Err, "timebox stats:", err)
		return nil, "", ExitFailed
	}
	if _, ok := st.(store.CallStats); !ok {
		st.Close()
		fmt.Fprintf(o.Err, "timebox stats: the store at %s cannot sum up its calls\n", where)
		return nil, "", ExitFailed
	}
	return st, where, ExitOK
}

// budgetsOf returns the budgets of the agent file for the report; none
// without one. A tool an MCP server lists (ENTRY__TOOL) has its entry's
// budget, or its override's: what the agent file gives it, found without
// starting the server.
func budgetsOf(cfg *config.Agent) advice.Budgets {
	if cfg == nil {
		return advice.Budgets{}
	}
	return advice.Budgets{
		ToolMax: cfg.Budgets.ToolMax.D,
		Phases: map[budget.Phase]budget.Duration{
			budget.PhaseLLMFirstChunk: cfg.Budgets.LLMFirstChunk,
			budget.PhaseCompaction:    cfg.Budgets.Compaction,
		},
		Tool: func(name string) (budget.ToolBudget, bool) { return toolBudget(cfg, name) },
	}
}

// toolBudget returns the budget the agent file gives the tool named so.
func toolBudget(cfg *config.Agent, name string) (budget.ToolBudget, bool) {
	for _, t := range cfg.Tools {
		if t.Kind != tool.KindMCP && t.Name == name {
			return t.Budget, true
		}
	}
	for _, t := range cfg.Tools {
		rest, ok := strings.CutPrefix(name, t.Name+"__")
		if t.Kind != tool.KindMCP || t.MCP == nil || !ok {
			continue
		}
		b := t.Budget
		if ov, ok := t.MCP.Overrides[rest]; ok {
			if ov.Timeout.Source != "" {
				b.Timeout = ov.Timeout
			}
			if ov.IdleTimeout.Source != "" {
				b.IdleTimeout = ov.IdleTimeout
			}
			if ov.Enforcement != "" {
				b.Enforcement = ov.Enforcement
			}
		}
		return b, true
	}
	return budget.ToolBudget{}, false
}

// applySuggestions writes the report's suggested timeouts into the agent
// file (stats --apply): the edit is checked by loading the edited file
// before it replaces the original, so a file that would not load is never
// written.
func applySuggestions(r advice.Report, c *common, fs *flag.FlagSet, dryRun bool, o IO) int {
	var edits []advice.Edit
	var left []string
	for _, t := range r.Tools {
		if hasFlag(t.Flags, advice.FlagProfile) {
			left = append(left, fmt.Sprintf("%s: its timeout is the profile %s; change timeouts.profiles, or give the tool a timeout of its own",
				t.Tool, strings.TrimPrefix(t.TimeoutSource, "profile:")))
		} else if t.SuggestedTimeoutMS != nil && *t.SuggestedTimeoutMS != t.TimeoutMS {
			edits = append(edits, advice.Edit{Tool: t.Tool, Key: "timeout", Value: time.Duration(*t.SuggestedTimeoutMS) * time.Millisecond})
		}
		if t.SuggestedIdleTimeoutMS != nil && *t.SuggestedIdleTimeoutMS != t.IdleTimeoutMS {
			edits = append(edits, advice.Edit{Tool: t.Tool, Key: "idle_timeout", Value: time.Duration(*t.SuggestedIdleTimeoutMS) * time.Millisecond})
		}
	}
	src, err := os.ReadFile(c.file)
	if err != nil {
		fmt.Fprintln(o.Err, "timebox stats:", err)
		return ExitFailed
	}
	out, skipped, err := advice.Apply(src, edits)
	if err != nil {
		fmt.Fprintf(o.Err, "timebox stats: %s: %v\n", c.file, err)
		return ExitFailed
	}
	for _, s := range append(left, skipped...) {
		fmt.Fprintf(o.Err, "not applied: %s\n", s)
	}
	if string(out) == string(src) {
		fmt.Fprintf(o.Err, "%s: nothing to change: every budget the records judge is as suggested (timebox stats shows the figures)\n", c.file)
		return ExitOK
	}
	// The edited file must load, with every edited tool's budget as
	// suggested, before it replaces the original.
	tmp, err := os.CreateTemp(filepath.Dir(c.file), "."+filepath.Base(c.file)+".*")
	if err != nil {
		fmt.Fprintln(o.Err, "timebox stats:", err)
		return ExitFailed
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(out); err != nil {
		tmp.Close()
		fmt.Fprintln(o.Err, "timebox stats:", err)
		return ExitFailed
	}
	tmp.Close()
	edited, err := config.Load(tmp.Name(), c.overrides(fs, o))
	if err != nil {
		fmt.Fprintf(o.Err, "timebox stats: the edited %s would not load, so it was not written:\n", c.file)
		printConfigError(o.Err, err)
		return ExitFailed
	}
	if err := checkEdits(edited, edits); err != nil {
		fmt.Fprintf(o.Err, "timebox stats: the edited %s would not be right, so it was not written: %v\n", c.file, err)
		return ExitFailed
	}
	fmt.Fprint(o.Out, advice.Diff(c.file, c.file+" (suggested)", src, out))
	if dryRun {
		fmt.Fprintf(o.Err, "dry run: %s was not changed (--apply without --dry-run writes it)\n", c.file)
		return ExitOK
	}
	if fi, err := os.Stat(c.file); err == nil {
		os.Chmod(tmp.Name(), fi.Mode().Perm())
	}
	if err := os.Rename(tmp.Name(), c.file); err != nil {
		fmt.Fprintln(o.Err, "timebox stats:", err)
		return ExitFailed
	}
	fmt.Fprintf(o.Err, "%s: %d budget%s written; timebox validate -f %[1]s shows them resolved\n", c.file, len(edits)-len(skipped), plural(len(edits)-len(skipped)))
	return ExitOK
}

// checkEdits reports an edit whose tool does not have the suggested budget
// in the edited file (one declared in the file itself; a server's tools
// are known only once it runs).
func checkEdits(cfg *config.Agent, edits []advice.Edit) error {
	for _, e := range edits {
		for _, t := range cfg.Tools {
			if t.Name != e.Tool || t.Kind == tool.KindMCP {
				continue
			}
			got := t.Budget.Timeout.D
			if e.Key == "idle_timeout" {
				got = t.Budget.IdleTimeout.D
			}
			if got != e.Value {
				return fmt.Errorf("tools[%s].%s is %s once edited, not %s", e.Tool, e.Key, advice.Format(got), advice.Format(e.Value))
			}
		}
	}
	return nil
}

// warnFromRecords prints validate's warnings about the tools whose
// timeout the calls of the last defaultStatsSince in the store db
// contradict (advice.Contradicted). It never creates a store: a SQLite
// file that is not there has no calls. A store that cannot be read is a
// warning, and the check is skipped.
func warnFromRecords(ctx context.Context, db string, tools []advice.NamedBudget, o IO) {
	if db == "" || len(tools) == 0 {
		return
	}
	if _, err := os.Stat(sqlitePath(db)); !postgres.IsURL(db) && err != nil {
		return
	}
	ended, traced := readerEnds(ctx, o, "validate")
	defer traced()
	var st store.Store
	var err error
	if postgres.IsURL(db) {
		// A database that does not answer costs validate 10s, not the
		// minute a gateway gives it.
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		st, err = postgres.Open(octx, db, postgres.Options{Ended: ended})
		cancel()
	} else if st, err = openSQLite(sqlitePath(db), ended); err != nil {
		st, err = sqlite.OpenReadOnly(sqlitePath(db))
	}
	if err != nil {
		fmt.Fprintf(o.Err, "warning: the timeouts were not checked against the stored calls: %v\n", err)
		return
	}
	defer st.Close()
	cs, ok := st.(store.CallStats)
	if !ok {
		return
	}
	since := time.Now().Add(-defaultStatsSince)
	stats, err := cs.ToolStats(ctx, store.StatsFilter{Since: since})
	if err != nil {
		fmt.Fprintf(o.Err, "warning: the timeouts were not checked against the calls stored in %s: %v\n", storeName(db), err)
		return
	}
	byTool := map[string]store.ToolStat{}
	for _, t := range stats {
		byTool[t.Tool] = t
	}
	warnings := advice.Contradicted(tools, byTool, since)
	for _, w := range warnings {
		fmt.Fprintln(o.Err, "warning:", w)
	}
	if len(warnings) > 0 {
		fmt.Fprintf(o.Err, "(from the calls stored in %s; timebox stats shows them all)\n", storeName(db))
	}
}

func hasFlag(flags []string, f string) bool {
	for _, x := range flags {
		if x == f {
			return true
		}
	}
	return false
}
