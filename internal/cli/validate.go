package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/config"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/tool/mcptool"
)

func cmdValidate(args []string, o IO) int {
	fs, c := newFlags("validate", o)
	pos, err := parse(fs, args)
	if err != nil {
		return usageExit(err)
	}
	if len(pos) > 0 {
		fmt.Fprintf(o.Err, "timebox validate: unexpected argument %q (the file is given with -f)\n", pos[0])
		return ExitUsage
	}
	cfg, ok := loadConfig(c, fs, o)
	if !ok {
		return ExitUsage
	}
	for _, ref := range cfg.Model.All() {
		for _, cr := range cfg.Providers[ref.Provider].Credentials {
			if o.getenv(cr.APIKeyEnv) == "" {
				fmt.Fprintf(o.Err, "warning: %s: credential %s is not set; that attempt will fail and failover will move past it\n", ref, cr.APIKeyEnv)
			}
		}
	}
	// An mcp entry's tools are known only to its server: start each one to
	// list them with their budgets, and report one that will not start.
	var servers []*mcptool.Server
	defer func() {
		for _, s := range servers {
			s.Close()
		}
	}()
	ctx, stop := interrupts(context.Background(), o)
	defer stop()
	failed := false
	for _, t := range cfg.Tools {
		if t.MCP == nil {
			continue
		}
		s, err := timebox.OpenMCP(ctx, t)
		if err != nil {
			fmt.Fprintf(o.Err, "timebox validate: tools[%s]: %v\n", t.Name, err)
			failed = true
			continue
		}
		servers = append(servers, s)
	}
	if failed {
		return ExitUsage
	}
	fmt.Fprintf(o.Out, "%s: ok\n\n", c.file)
	config.WriteTable(o.Out, cfg)
	if len(servers) > 0 {
		writeMCPTools(o.Out, servers)
	}
	return ExitOK
}

// writeMCPTools lists the tools of each started MCP server with its resolved
// budget, in the columns of the tool table.
func writeMCPTools(w io.Writer, servers []*mcptool.Server) {
	fmt.Fprintln(w, "\nMCP tools (listed by their servers):")
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tKIND\tTIMEOUT\tSOURCE\tIDLE\tENFORCEMENT\tKNOB")
	for _, s := range servers {
		for _, t := range s.Tools() {
			b := t.Budget()
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Spec().Name, t.Kind(), shortDuration(b.Timeout), b.Timeout.Source,
				shortDuration(b.IdleTimeout), b.Enforcement, b.Timeout.Knob)
		}
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
		fmt.Fprintln(o.Err, "usage: timebox tool call NAME --input '{...}' [-f agent.yaml]")
		return ExitUsage
	}
	cfg, ok := loadConfig(c, fs, o)
	if !ok {
		return ExitUsage
	}
	ctx, stop := interrupts(ctx, o)
	defer stop()
	a, err := timebox.Build(ctx, cfg, timebox.Options{Getenv: o.getenv})
	if err != nil {
		fmt.Fprintln(o.Err, "timebox:", err)
		return ExitUsage
	}
	defer a.Close()
	var names []string
	found := false
	for _, t := range a.Tools() {
		names = append(names, t.Tool.Spec().Name)
		found = found || t.Tool.Spec().Name == pos[0]
	}
	if !found {
		fmt.Fprintf(o.Err, "timebox: no tool named %q; the agent has: %s\n", pos[0], strings.Join(names, ", "))
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
