package temporal_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/temporal"
)

// manyCallsAgent writes into dir an agent whose model replies once with n
// calls of an exec tool (`true`), then answers; limits is the agent
// file's limits line, if any.
func manyCallsAgent(dir string, n int, limits string) string {
	var sb strings.Builder
	sb.WriteString(`{"tool_calls": [`)
	for i := range n {
		if i > 0 {
			sb.WriteString(",")
		}
		fmt.Fprintf(&sb, `{"name": "noop", "arguments": {"i": %d}}`, i)
	}
	sb.WriteString("]}\n{\"text\": \"done\"}\n")
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(sb.String()), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte("name: many\nmodel: {primary: script:m}\nproviders: {script: {file: script.jsonl}}\ntimeouts: {turn: 1h}\n"+
		limits+"tools:\n  - name: noop\n    exec: [\"true\"]\n    timeout: 5s\n"), 0o644)
	return file
}

// workflowHistory is what a workflow's history holds, over all its runs
// (continue-as-new).
type workflowHistory struct {
	// Locals counts the local activities by type; Activities the
	// activities scheduled.
	Locals     map[string]int
	Activities int
	Events     int
	Runs       int
	// Bytes is the histories' size, as the server counts it.
	Bytes int64
}

// readHistory reads the history of workflow id, every run's.
func readHistory(t testing.TB, c client.Client, id string) workflowHistory {
	t.Helper()
	h := workflowHistory{Locals: map[string]int{}}
	for run := ""; ; h.Runs++ {
		// The last run first, then the run each continued.
		d, err := c.DescribeWorkflowExecution(context.Background(), id, run)
		if err != nil {
			t.Fatal(err)
		}
		h.Bytes += d.GetWorkflowExecutionInfo().GetHistorySizeBytes()
		it := c.GetWorkflowHistory(context.Background(), id, run, false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		run = ""
		for it.HasNext() {
			e, err := it.Next()
			if err != nil {
				t.Fatal(err)
			}
			h.Events++
			if a := e.GetWorkflowExecutionStartedEventAttributes(); a != nil {
				run = a.GetContinuedExecutionRunId()
			}
			if e.EventType == enums.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED {
				h.Activities++
			}
			m := e.GetMarkerRecordedEventAttributes()
			if e.EventType != enums.EVENT_TYPE_MARKER_RECORDED || m.GetMarkerName() != "LocalActivity" {
				continue
			}
			var data struct{ ActivityType string }
			if p := m.GetDetails()["data"].GetPayloads(); len(p) > 0 {
				json.Unmarshal(p[0].GetData(), &data)
			}
			h.Locals[data.ActivityType]++
		}
		if run == "" {
			h.Runs++
			return h
		}
	}
}

// TestManyRefusedOnTemporal: a reply of 2,500 calls under max_tool_calls
// 5 ends on Temporal as on the embedded engine — every refused call with
// its record, its tool_finished and its tool message — and its 2,495
// refusals take three local activities (RefuseCalls, up to 1,000 calls
// each), not one a call.
func TestManyRefusedOnTemporal(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	const n, limit = 2500, 5
	embedded, onTemporal, c := onBoth(t, manyCallsAgent(t.TempDir(), n, fmt.Sprintf("limits: {max_tool_calls: %d}\n", limit)))

	rec := onTemporal.Record
	if rec.StopReason != budget.MaxToolCalls || len(rec.ToolCalls) != n {
		t.Fatalf("turn ended %s with %d records: %s", rec.StopReason, len(rec.ToolCalls), rec.Message)
	}
	if diff := cmp.Diff(shape(embedded.Record), shape(rec)); diff != "" {
		t.Errorf("the turn on Temporal differs from the embedded one (-embedded +temporal):\n%s", diff)
	}
	// The time a result tells the model its call took differs.
	elapsed := cmp.Transformer("elapsed", func(s string) string {
		return tookRE.ReplaceAllString(elapsedRE.ReplaceAllString(s, `"elapsed":"…"`), "[timebox: took … of")
	})
	// The store keeps a call's arguments as JSON of its own spacing.
	compact := cmp.Transformer("compact", func(m json.RawMessage) string {
		var b bytes.Buffer
		json.Compact(&b, m)
		return b.String()
	})
	opts := []cmp.Option{
		elapsed, compact,
		cmpopts.IgnoreFields(event.ToolCall{}, "TurnID", "StartedAt", "EndedAt", "DurationMS", "StderrTail"),
		cmpopts.SortSlices(func(a, b event.ToolCall) bool { return a.CallID < b.CallID }),
	}
	if diff := cmp.Diff(embedded.Record.ToolCalls, rec.ToolCalls, opts...); diff != "" {
		t.Errorf("tool call records differ (-embedded +temporal):\n%s", diff)
	}
	if diff := cmp.Diff(embedded.Messages, onTemporal.Messages, elapsed); diff != "" {
		t.Errorf("messages differ (-embedded +temporal):\n%s", diff)
	}
	refused := 0
	for _, tc := range rec.ToolCalls {
		if tc.Refused == machine.RefusedLimit {
			refused++
		}
	}
	if refused != n-limit {
		t.Errorf("%d calls refused, want %d", refused, n-limit)
	}
	if h := readHistory(t, c, temporal.WorkflowID(rec.TurnID)); h.Locals["timebox.RefuseCalls"] != 3 || h.Locals["timebox.Refuse"] != 0 {
		t.Errorf("local activities %v: want the refusals in 3 RefuseCalls", h.Locals)
	}
}
