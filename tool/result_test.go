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

// TestTimedResult: with time notes, an ok result ends with one line of its
// time against its budget, an error object carries elapsed and limit (and
// overran for an advisory call past its budget), and a timeout is as it
// was.
func TestTimedResult(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(d time.Duration) (time.Time, time.Time) { return start, start.Add(d) }
	for _, tc := range []struct {
		name string
		b    budget.ToolBudget
		x    tool.Execution
		want string
	}{
		{name: "ok", b: tb(10*time.Second, budget.Hard),
			x:    tool.Execution{Outcome: event.OutcomeOK, Result: &tool.Result{Output: []byte(`{"n":3}`)}},
			want: "{\"n\":3}\n[timebox: took 1.2s of 10s]"},
		{name: "no output", b: tb(10*time.Second, budget.Hard),
			x:    tool.Execution{Outcome: event.OutcomeOK, Result: &tool.Result{}},
			want: "[timebox: took 1.2s of 10s]"},
		{name: "overran", b: tb(time.Second, budget.Advisory),
			x:    tool.Execution{Outcome: event.OutcomeOK, Overran: true, Result: &tool.Result{Output: []byte("late\n")}},
			want: "late\n[timebox: took 1.2s of 1s: overran its advisory budget]"},
		{name: "error", b: tb(time.Second, budget.Advisory),
			x:    tool.Execution{Outcome: event.OutcomeError, Overran: true, Err: errString("boom")},
			want: `{"error":{"type":"tool_error","tool":"t","limit":"1s","elapsed":"1.2s","message":"Tool \"t\" failed: boom","overran":true}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			x := tc.x
			x.Started, x.Ended = at(1234 * time.Millisecond)
			if got := tool.TimedResult("t", tc.b, &x); got != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
			if got := tool.ModelResult("t", tc.b, &x); strings.Contains(got, "1.2s") {
				t.Errorf("ModelResult carries the time: %s", got)
			}
		})
	}
}

type errString string

func (e errString) Error() string { return string(e) }
