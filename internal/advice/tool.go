package advice

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/timebox-run/timebox/internal/problem"
	"github.com/timebox-run/timebox/store"
)

// UnknownTool says, when a report is asked for one tool (name)
// of which no call was ever recorded in cs (the store at where), at any
// time: a misspelt name
// would otherwise read as "no calls", as if the tool had not run lately.
// The problem names the tool meant ("did you mean web_fetch?"), or the
// tools recorded; it is "" for a tool recorded at any time (one recorded
// only before the report's --since is no problem: the report says to
// widen it). err is the store's failure to answer.
func UnknownTool(ctx context.Context, cs store.CallStats, where, name string) (problem string, err error) {
	if name == "" {
		return "", nil
	}
	all, err := cs.ToolStats(ctx, store.StatsFilter{})
	if err != nil {
		return "", err
	}
	names := make([]string, 0, len(all))
	for _, t := range all {
		if t.Tool == name {
			return "", nil
		}
		names = append(names, t.Tool)
	}
	if len(names) == 0 {
		return fmt.Sprintf("no call of a tool named %q was ever recorded in %s: it has no tool calls yet (run some turns first)", name, where), nil
	}
	hint := didYouMean(name, names)
	if hint == "" {
		slices.Sort(names)
		if len(names) > 20 {
			names = append(names[:20], "…")
		}
		hint = " (the tools recorded: " + strings.Join(names, ", ") + ")"
	}
	return fmt.Sprintf("no call of a tool named %q was ever recorded in %s%s", name, where, hint), nil
}

// didYouMean is problem.DidYouMean, under a name the result of
// UnknownTool does not shadow.
func didYouMean(s string, candidates []string) string { return problem.DidYouMean(s, candidates) }
