package advice

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/timebox-run/timebox/internal/problem"
	"github.com/timebox-run/timebox/store"
)

// CheckTool returns an error when a report is asked for one tool (name)
// of which no call was ever recorded in cs (the store at where), at any
// time: a misspelt name
// would otherwise read as "no calls", as if the tool had not run lately.
// The error names the tool meant ("did you mean web_fetch?"), or the tools
// recorded. A tool recorded only before the report's --since is no error:
// the report says to widen it.
func CheckTool(ctx context.Context, cs store.CallStats, where, name string) error {
	if name == "" {
		return nil
	}
	all, err := cs.ToolStats(ctx, store.StatsFilter{})
	if err != nil {
		return err
	}
	names := make([]string, 0, len(all))
	for _, t := range all {
		if t.Tool == name {
			return nil
		}
		names = append(names, t.Tool)
	}
	if len(names) == 0 {
		return fmt.Errorf("no call of a tool named %q was ever recorded in %s: it has no tool calls yet (run some turns first)", name, where)
	}
	hint := problem.DidYouMean(name, names)
	if hint == "" {
		slices.Sort(names)
		if len(names) > 20 {
			names = append(names[:20], "…")
		}
		hint = " (the tools recorded: " + strings.Join(names, ", ") + ")"
	}
	return fmt.Errorf("no call of a tool named %q was ever recorded in %s%s", name, where, hint)
}
