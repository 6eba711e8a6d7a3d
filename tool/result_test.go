package tool_test

import (
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/tool"
)

// The message of an abandoned call reads as sentences: the limit, then
// what timebox did about the call that would not stop.
func TestModelResultOfAnAbandonedCall(t *testing.T) {
	b := tb(time.Second, budget.Cooperative)
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	x := &tool.Execution{Outcome: event.OutcomeAbandoned, Phase: budget.PhaseTool, Abandoned: true,
		Started: start, Ended: start.Add(3 * time.Second),
		Cause: &budget.TimeoutError{Phase: budget.PhaseTool, Limit: time.Second, Source: budget.SourceTool, Knob: "tools[t].timeout in agent.yaml"}}
	res := tool.ModelResult("t", b, x)
	want := `Tool \"t\" did not finish within 1s. It was asked to stop and had not after 2s, so timebox stopped waiting for it.`
	if !strings.Contains(res, want) {
		t.Fatalf("model result %s\nwant it to contain %s", res, want)
	}
}
