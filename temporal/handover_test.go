package temporal_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/worker"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/temporal"
)

// TestAStoppedWorkerHandsItsTurnOverAtOnce: a worker stopped (SIGTERM, a
// rolling deploy) while a model attempt streams hands its turn over at
// once: the next worker asks the step again well within the 5s a killed
// worker's turn waits for its workflow task to time out.
func TestAStoppedWorkerHandsItsTurnOverAtOnce(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	id := agent.NewTurnID()
	queue += "-" + id
	file := slowAttemptAgent(t, "handover")
	wa := namedWorker(t, c, queue, openAgent(t, file).Agent, s, "stopping")
	done := startRun(t, c, s, queue, openAgent(t, file).Agent, id)
	waitStored(t, s, id, event.TypeLLMStarted, "the attempt to start")
	// The next worker polls before the stop: what is measured is the
	// hand-over, not its start.
	t.Cleanup(namedWorker(t, c, queue, openAgent(t, file).Agent, s, "next").Stop)
	stopped := time.Now()
	wa.Stop()
	var began time.Time
	wait.For(t, 30*time.Second, "the step asked again", func() bool {
		evs, _ := s.Events(context.Background(), id, 0, 0)
		for _, e := range evs {
			if d, ok := e.Data.(*event.LLMStarted); ok && d.Step == 1 && d.Attempt == 2 {
				began = e.At
				return true
			}
		}
		return false
	})
	res := <-done
	logHistory(t, c, temporal.WorkflowID(id), stopped)
	if res.Record.Status != budget.StatusCompleted {
		t.Fatalf("turn %s (%s)", res.Record.Status, res.Record.Message)
	}
	took := began.Sub(stopped)
	t.Logf("stop to the attempt asked again: %s", took)
	if took > 2500*time.Millisecond {
		t.Errorf("the step was asked again %s after its worker was stopped; want at once (≤ 2.5s)", took)
	}
}

// logHistory logs the workflow's history, each event's time from since.
func logHistory(t *testing.T, c client.Client, wid string, since time.Time) {
	t.Helper()
	it := c.GetWorkflowHistory(context.Background(), wid, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	var b strings.Builder
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			t.Logf("history: %v", err)
			return
		}
		fmt.Fprintf(&b, "%3d %+8dms %s", e.GetEventId(), e.GetEventTime().AsTime().Sub(since).Milliseconds(), e.GetEventType())
		if a := e.GetWorkflowTaskTimedOutEventAttributes(); a != nil {
			fmt.Fprintf(&b, " %s", a.GetTimeoutType())
		}
		if a := e.GetWorkflowTaskFailedEventAttributes(); a != nil {
			fmt.Fprintf(&b, " %s", a.GetCause())
		}
		if a := e.GetWorkflowTaskScheduledEventAttributes(); a != nil {
			fmt.Fprintf(&b, " %s", a.GetTaskQueue().GetName())
		}
		if a := e.GetWorkflowTaskStartedEventAttributes(); a != nil {
			fmt.Fprintf(&b, " %s", a.GetIdentity())
		}
		if a := e.GetActivityTaskStartedEventAttributes(); a != nil {
			fmt.Fprintf(&b, " %s", a.GetIdentity())
		}
		if a := e.GetActivityTaskFailedEventAttributes(); a != nil {
			fmt.Fprintf(&b, " %s: %s", a.GetIdentity(), a.GetFailure().GetMessage())
		}
		if a := e.GetActivityTaskTimedOutEventAttributes(); a != nil {
			fmt.Fprintf(&b, " %s", a.GetFailure().GetMessage())
		}
		b.WriteString("\n")
	}
	t.Logf("history (ms from the stop):\n%s", b.String())
}

// TestAWorkerStoppedMidTool: a worker stopped (SIGTERM) while a tool call
// runs stops the tool, records the call, and the turn goes on on another
// worker.
func TestAWorkerStoppedMidTool(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	id := agent.NewTurnID()
	queue += "-" + id
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"tool_calls": [{"name": "long"}]}`+"\n"+`{"text": "done"}`+"\n"), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte("name: stopped-tool\nmodel: {primary: script:test}\nproviders: {script: {file: script.jsonl}}\n"+
		"timeouts: {turn: 1m, kill_grace: 500ms}\ntools:\n  - {name: long, description: Long., exec: [sleep, \"30\"], timeout: 50s}\n"), 0o644)
	wa := namedWorker(t, c, queue, openAgent(t, file).Agent, s, "stopping")
	done := startRun(t, c, s, queue, openAgent(t, file).Agent, id)
	waitStored(t, s, id, event.TypeToolStarted, "the tool to start")
	t.Cleanup(namedWorker(t, c, queue, openAgent(t, file).Agent, s, "next").Stop)
	stopped := time.Now()
	wa.Stop()
	t.Logf("stop took %s", time.Since(stopped))
	var began time.Time
	wait.For(t, 60*time.Second, "step 2 asked", func() bool {
		evs, _ := s.Events(context.Background(), id, 0, 0)
		for _, e := range evs {
			if d, ok := e.Data.(*event.LLMStarted); ok && d.Step == 2 {
				began = e.At
				return true
			}
		}
		return false
	})
	res := <-done
	logHistory(t, c, temporal.WorkflowID(id), stopped)
	t.Logf("stop to step 2 asked: %s", began.Sub(stopped))
	for _, tc := range res.Record.ToolCalls {
		t.Logf("call %s: %s/%s ran %dms", tc.Tool, tc.Outcome, tc.Phase, tc.DurationMS)
	}
	if res.Record.Status != budget.StatusCompleted {
		t.Fatalf("turn %s (%s)", res.Record.Status, res.Record.Message)
	}
}

// namedWorker is runningWorker with an identity, which the workflow's
// history names for each workflow task a worker took.
func namedWorker(t *testing.T, c client.Client, queue string, a *agent.Agent, s store.Store, identity string) worker.Worker {
	t.Helper()
	w, err := temporal.NewWorker(temporal.WorkerOptions{Client: c, TaskQueue: queue, Agent: a, Store: s, Heartbeat: time.Second,
		Options: worker.Options{Identity: identity}})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Start(); err != nil {
		t.Fatal(err)
	}
	return w
}
