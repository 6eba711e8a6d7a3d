package temporal

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"
	"go.temporal.io/sdk/worker"
	"go.temporal.io/sdk/workflow"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/store"
)

var (
	record     = flag.Bool("record", false, "record the workflow histories of testdata/replay anew (needs the Temporal dev server)")
	recordOnly = flag.String("record-only", "", "with -record, record only the scenario of this name: a new one, the others kept")
)

// replayScenarios are the turns whose workflow histories testdata/replay
// keeps: each a turn of the agent there, with request budgets, cancelled
// after cancel if that is set, with maxHistory set to history if that is.
var replayScenarios = []struct {
	name    string
	budgets budget.Request
	cancel  time.Duration
	history int
}{
	{name: "answer", budgets: budget.Request{"tool": "1s"}},
	{name: "max_tool_calls", budgets: budget.Request{"tool": "1s", "max_tool_calls": "4"}},
	{name: "cancel", cancel: 500 * time.Millisecond},
	{name: "ceiling", budgets: budget.Request{"turn": "1s"}},
	{name: "continue_as_new", budgets: budget.Request{"tool": "1s"}, history: 20},
	// The calls past max_tool_calls refused in one local activity
	// (refuseBatch): recorded with it; max_tool_calls, before it.
	{name: "refuse_batch", budgets: budget.Request{"tool": "1s", "max_tool_calls": "1"}},
	// A batch's still_working notices sent by the workflow, one a beat
	// (batchBeat): the wait call is silent for 2s, two beats of
	// timeouts.progress_notice (700ms in agent.yaml since this scenario;
	// the state the others were recorded with has the default).
	{name: "batch_beat", budgets: budget.Request{"tool": "2s"}},
}

// TestReplay replays the workflow histories recorded in testdata/replay
// with the workflow as it is now: a change of the workflow that would
// break the turns running when it is deployed fails here. Such a change
// goes behind workflow.GetVersion (the histories of this directory were
// recorded with none), and the recordings are kept; new ones are added
// with -record.
func TestReplay(t *testing.T) {
	units := replayUnits(t)
	if *record {
		recordHistories(t, units)
	}
	files, err := filepath.Glob(filepath.Join("testdata", "replay", "*.history.json"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < len(replayScenarios) {
		t.Fatalf("testdata/replay has %d histories, want %d: record them with -record", len(files), len(replayScenarios))
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".history.json")
		t.Run(name, func(t *testing.T) {
			// The history length past which a turn continues as new was
			// the scenario's when it was recorded: it decides, as the code
			// does, when the run ended.
			for _, sc := range replayScenarios {
				if sc.history > 0 && strings.HasPrefix(name, sc.name) {
					defer func(n int) { maxHistory = n }(maxHistory)
					maxHistory = sc.history
				}
			}
			r := worker.NewWorkflowReplayer()
			wf := &turnWorkflow{units: units, heartbeat: time.Second}
			r.RegisterWorkflowWithOptions(wf.run, workflow.RegisterOptions{Name: WorkflowName})
			if err := r.ReplayWorkflowHistoryFromJSONFile(sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler)), f); err != nil {
				t.Fatalf("the workflow no longer replays %s: %v", f, err)
			}
		})
	}
}

func replayUnits(t *testing.T) machine.Units {
	t.Helper()
	a, err := timebox.Open(context.Background(), filepath.Join("testdata", "replay", "agent.yaml"), timebox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	units, _ := machine.UnitsOf(a.Agent)
	return units
}

// recordHistories runs each scenario on the dev server, with an in-memory
// store, and writes its workflow's history (every run's, for a turn that
// continued as new) to testdata/replay.
func recordHistories(t *testing.T, units machine.Units) {
	addr := testenv.Temporal(t)
	c, err := client.Dial(client.Options{HostPort: addr, Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	a, err := timebox.Open(context.Background(), filepath.Join("testdata", "replay", "agent.yaml"), timebox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	for _, sc := range replayScenarios {
		if *recordOnly != "" && sc.name != *recordOnly {
			continue
		}
		func() {
			st := store.NewMemory()
			defer st.Close()
			queue := fmt.Sprintf("replay-%s-%d", sc.name, time.Now().UnixNano())
			w, err := NewWorker(WorkerOptions{Client: c, TaskQueue: queue, Agent: a.Agent, Store: st, Heartbeat: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			if err := w.Start(); err != nil {
				t.Fatal(err)
			}
			defer w.Stop()
			if sc.history > 0 {
				defer func(n int) { maxHistory = n }(maxHistory)
				maxHistory = sc.history
			}
			r, err := NewRunner(c, st, queue, a.Agent)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if sc.cancel > 0 {
				var cancel context.CancelCauseFunc
				ctx, cancel = context.WithCancelCause(ctx)
				timer := time.AfterFunc(sc.cancel, func() { cancel(&budget.CancelError{Reason: budget.Cancelled, By: "the recording"}) })
				defer timer.Stop()
			}
			res := r.Run(ctx, agent.Input{Text: "go", Budgets: sc.budgets})
			t.Logf("%s: %s/%s: %s", sc.name, res.Record.Status, res.Record.StopReason, res.Record.Message)
			// The turn ends in the store before its workflow completes:
			// the history is read once it has.
			if err := c.GetWorkflow(context.Background(), WorkflowID(res.Record.TurnID), "").Get(context.Background(), nil); err != nil {
				t.Logf("%s: the workflow ended with %v", sc.name, err)
			}
			writeHistories(t, c, WorkflowID(res.Record.TurnID), sc.name)
		}()
	}
}

// writeHistories writes the history of every run of a workflow, the first
// first.
func writeHistories(t *testing.T, c client.Client, id, name string) {
	var runs []string
	for run := ""; ; {
		h := history(t, c, id, run)
		runs = append(runs, string(mustJSON(t, h)))
		first := h.Events[0].GetWorkflowExecutionStartedEventAttributes()
		if first == nil || first.GetContinuedExecutionRunId() == "" {
			break
		}
		run = first.GetContinuedExecutionRunId()
	}
	for i := range runs {
		// The runs were read newest first.
		n := len(runs) - 1 - i
		file := filepath.Join("testdata", "replay", fmt.Sprintf("%s-%d.history.json", name, n))
		if len(runs) == 1 {
			file = filepath.Join("testdata", "replay", name+".history.json")
		}
		if err := os.WriteFile(file, []byte(runs[i]), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func history(t *testing.T, c client.Client, id, run string) *historypb.History {
	t.Helper()
	h := &historypb.History{}
	it := c.GetWorkflowHistory(context.Background(), id, run, false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		h.Events = append(h.Events, e)
	}
	return h
}

func mustJSON(t *testing.T, h *historypb.History) []byte {
	t.Helper()
	b, err := protojson.MarshalOptions{Indent: " "}.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
