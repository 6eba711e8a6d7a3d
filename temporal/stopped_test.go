package temporal_test

import (
	"context"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/temporal"
)

// TestAWorkerStoppedMidAttempt: a worker stopped (SIGTERM, a deploy) while
// a model attempt streams gives it up, and another worker asks the step
// again. The given-up attempt's record says the worker stopping gave it
// up, not that the turn's workflow cancelled it: nothing cancelled the
// turn, and a person reading the timeline must not look for who did.
func TestAWorkerStoppedMidAttempt(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	id := agent.NewTurnID()
	queue += "-" + id
	file := slowAttemptAgent(t, "stopped")
	wa := runningWorker(t, c, queue, openAgent(t, file).Agent, s)
	r, err := temporal.NewRunner(c, s, queue, openAgent(t, file).Agent)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan *agent.Result, 1)
	go func() { done <- r.Run(context.Background(), agent.Input{TurnID: id, Text: "go"}) }()
	waitStored(t, s, id, event.TypeLLMStarted, "the attempt to start")
	wa.Stop()
	startWorker(t, c, s, queue, openAgent(t, file).Agent)
	res := <-done
	if res.Record.Status != budget.StatusCompleted {
		t.Fatalf("turn %s (%s)", res.Record.Status, res.Record.Message)
	}
	for _, mc := range res.Record.ModelCalls {
		t.Logf("attempt %d: %s %s %q", mc.Attempt, mc.Outcome, mc.Phase, mc.Error)
		if mc.Outcome != event.OutcomeOK && (strings.Contains(mc.Error, "workflow") || !strings.Contains(mc.Error, "worker")) {
			t.Errorf("the attempt given up by the stopping worker says %q; want it to name the worker stopping", mc.Error)
		}
	}
}
