package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/config"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/advice"
	"github.com/timebox-run/timebox/model/script"
	"github.com/timebox-run/timebox/tool"
)

const validateUsage = `usage: timebox validate [-f agent.yaml] [--db STORE] [budget flags]

Checks the agent file as a turn would start from it, without calling the
model: the file, its flags and variables, each tool built (MCP servers
started and their tools listed); then prints the budget each tool and the
turn get, with where each came from, and warns of budgets that cannot be
right or that the store's calls contradict. Exit 0 when it is fine, 2 when
not.
`

// cmdValidate checks everything run would check before a turn starts, by
// the same code path: the agent file, its flags and variables (config.Load:
// the script parsed line by line, every program found and executable,
// every file a regular one), then the agent built as run builds it (each
// MCP server started and its tools listed, each Go tool's budget checked).
// Only the model is not called. A call of the script to a tool the agent
// lacks is a warning; so are budgets that cannot be right and, when the
// store exists, budgets its calls contradict (internal/advice).
func cmdValidate(args []string, o IO) int {
	fs, c := newFlags("validate", o)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), validateUsage)
		printFlags(fs, "validate")
	}
	ef := addEngineFlags(fs, true, true)
	dbFlag := fs.String("db", "", "the store whose calls each tool's timeout is checked against, when it exists: a SQLite file or a postgres:// URL (env TIMEBOX_DB; default "+stateDB(o)+")")
	pos, err := parse(fs, args)
	if err != nil {
		return usageExit(err)
	}
	es, err := ef.resolve(fs, o)
	if err != nil {
		fmt.Fprintln(o.Err, "timebox validate:", err)
		return ExitUsage
	}
	if len(pos) > 0 {
		fmt.Fprintf(o.Err, "timebox validate: unexpected argument %q (the file is given with -f)\n", pos[0])
		return ExitUsage
	}
	cfg, ok := loadConfig(c, fs, o)
	if !ok {
		return ExitUsage
	}
	if err := timebox.NoCredential(cfg, o.getenv); err != nil {
		// Not an error here: a file is often checked where its keys are
		// not (CI), but it must not read as if a turn could go on.
		fmt.Fprintf(o.Err, "warning: %v; until one is set, timebox run and serve refuse to start (exit 2)\n", err)
	} else {
		for _, ref := range cfg.Model.All() {
			for _, cr := range cfg.Providers[ref.Provider].Credentials {
				if o.getenv(cr.APIKeyEnv) == "" {
					fmt.Fprintf(o.Err, "warning: %s: credential %s is not set; that attempt will fail and failover will move past it\n", ref, cr.APIKeyEnv)
				}
			}
		}
	}
	if _, err := cfg.WebhookSecrets(o.getenv); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			fmt.Fprintf(o.Err, "warning: %s; timebox serve will not start without it\n", line)
		}
	}
	ctx, stop := interrupts(context.Background(), o)
	defer stop()
	a, err := timebox.Build(ctx, cfg, timebox.Options{Getenv: o.getenv})
	if err != nil {
		fmt.Fprintln(o.Err, "timebox validate:", err)
		return ExitUsage
	}
	defer a.Close()
	warnUnknownTools(o.Err, cfg, a.Tools())
	var budgets []advice.NamedBudget
	for _, t := range a.Tools() {
		budgets = append(budgets, advice.NamedBudget{Name: t.Tool.Spec().Name, Budget: t.Budget})
	}
	for _, w := range advice.Impossible(budgets) {
		fmt.Fprintln(o.Err, "warning:", w)
	}
	warnFromRecords(ctx, setting(fs, "db", *dbFlag, "TIMEBOX_DB", o, stateDB(o)), budgets, o)
	fmt.Fprintf(o.Out, "%s: ok\n\n", c.file)
	config.WriteTable(o.Out, cfg)
	writeMCPTools(o.Out, a.Tools())
	writeWebhooks(o.Out, cfg, o.getenv)
	es.describe(o.Out)
	return ExitOK
}

// warnUnknownTools warns of each call of the script to a tool the agent
// does not have. It is a warning, not an error: a script may call a
// missing tool on purpose, to show what the model is told. The agent is
// built, so its tools are all known, the MCP servers' included (as
// entry__tool).
func warnUnknownTools(w io.Writer, cfg *config.Agent, tools []agent.Tool) {
	played := false
	for _, ref := range cfg.Model.All() {
		played = played || ref.Provider == "script"
	}
	if !played {
		return // a script no model of the chain plays calls nothing
	}
	names := make([]string, len(tools))
	for i, t := range tools {
		names[i] = t.Tool.Spec().Name
	}
	for _, p := range script.UnknownTools(cfg.Providers["script"].Script, names) {
		fmt.Fprintln(w, "warning:", p)
	}
}

// writeMCPTools lists the tools the MCP servers gave, with their resolved
// budgets, in the columns of the tool table, and for each how long a call
// waits for a person's decision and from where ("-": it never asks).
func writeMCPTools(w io.Writer, tools []agent.Tool) {
	var mcp []agent.Tool
	for _, t := range tools {
		if t.Tool.Kind() == tool.KindMCP {
			mcp = append(mcp, t)
		}
	}
	if len(mcp) == 0 {
		return
	}
	fmt.Fprintln(w, "\nMCP tools (listed by their servers):")
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tKIND\tTIMEOUT\tSOURCE\tIDLE\tENFORCEMENT\tAPPROVAL\tKNOB")
	for _, t := range mcp {
		b := t.Budget
		approval := "-"
		if t.NeedsApproval != nil {
			approval = shortDuration(t.ApprovalTimeout) + " (" + string(t.ApprovalTimeout.Source) + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Tool.Spec().Name, t.Tool.Kind(), shortDuration(b.Timeout), b.Timeout.Source,
			shortDuration(b.IdleTimeout), b.Enforcement, approval, b.Timeout.Knob)
	}
	tw.Flush()
}

// shortDuration writes a budget as the tool table above does: 10m, not
// 10m0s.
func shortDuration(d budget.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func cmdToolCall(ctx context.Context, args []string, o IO) int {
	fs, c := newFlags("tool call", o)
	input := fs.String("input", "{}", "the call's arguments, a JSON object")
	pos, err := parse(fs, args)
	if err != nil {
		return usageExit(err)
	}
	if len(pos) != 1 {
		fmt.Fprintln(o.Err, synopses["tool call"])
		return ExitUsage
	}
	// The arguments of a call are a JSON object; anything else is the
	// caller's mistake, said before any tool or server starts.
	var object map[string]json.RawMessage
	if err := json.Unmarshal([]byte(*input), &object); err != nil || object == nil {
		why := "it is not JSON"
		if err == nil || json.Valid([]byte(*input)) {
			why = "it is JSON, but not an object"
		} else {
			why += ": " + strings.TrimPrefix(err.Error(), "json: ")
		}
		fmt.Fprintf(o.Err, "timebox tool call: --input %s: %s (give the arguments as one JSON object, such as --input '{\"url\": \"https://example.org\"}')\n", strconv.Quote(clip(*input, 80)), why)
		return ExitUsage
	}
	cfg, ctx, stop, ok := loadToRun(ctx, c, fs, o)
	if !ok {
		return ExitUsage
	}
	defer stop()
	a, err := timebox.Build(ctx, cfg, timebox.Options{Getenv: o.getenv})
	if err != nil {
		fmt.Fprintln(o.Err, "timebox:", err)
		return ExitUsage
	}
	defer a.Close()
	if err := noSuchTool(a.Agent, pos[0]); err != nil {
		fmt.Fprintln(o.Err, "timebox:", err)
		return ExitUsage
	}
	v := newView(o.Err, false, false)
	v.told = "the caller"
	rec := a.CallTool(ctx, pos[0], json.RawMessage(*input), v)
	b, _ := json.MarshalIndent(rec, "", "  ")
	fmt.Fprintln(o.Out, string(b))
	switch rec.Outcome {
	case event.OutcomeOK:
		return ExitOK
	case event.OutcomeTimedOut, event.OutcomeAbandoned:
		return ExitStopped
	case event.OutcomeCancelled:
		return ExitCancelled
	}
	return ExitFailed
}
