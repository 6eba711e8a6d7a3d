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

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
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

// localActivities counts the local activities of a workflow's history (its
// last run's) by activity type, and returns the number of its events.
func localActivities(t testing.TB, c client.Client, id string) (map[string]int, int) {
	t.Helper()
	n := map[string]int{}
	events := 0
	it := c.GetWorkflowHistory(context.Background(), id, "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
	for it.HasNext() {
		e, err := it.Next()
		if err != nil {
			t.Fatal(err)
		}
		events++
		m := e.GetMarkerRecordedEventAttributes()
		if e.EventType != enums.EVENT_TYPE_MARKER_RECORDED || m.GetMarkerName() != "LocalActivity" {
			continue
		}
		var data struct{ ActivityType string }
		if p := m.GetDetails()["data"].GetPayloads(); len(p) > 0 {
			json.Unmarshal(p[0].GetData(), &data)
		}
		n[data.ActivityType]++
	}
	return n, events
}

// TestManyRefusedOnTemporal: a reply of 2,500 calls under max_tool_calls
// 5 ends on Temporal as on the embedded engine — every refused call with
// its record, its tool_finished and its tool message — and its 2,495
// refusals take three local activities (RefuseCalls, up to 1,000 calls
// each), not one a call.
func TestManyRefusedOnTemporal(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	const n, limit = 2500, 5
	file := manyCallsAgent(t.TempDir(), n, fmt.Sprintf("limits: {max_tool_calls: %d}\n", limit))
	open := func() *timebox.Agent {
		a, err := timebox.Open(context.Background(), file, timebox.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close() })
		return a
	}
	embedded := open().Run(context.Background(), agent.Input{Text: "go"})
	a := open()
	startWorker(t, c, s, queue, a.Agent)
	r, _ := temporal.NewRunner(c, s, queue, a.Agent)
	onTemporal := r.Run(context.Background(), agent.Input{Text: "go"})

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
	locals, _ := localActivities(t, c, temporal.WorkflowID(rec.TurnID))
	if locals["timebox.RefuseCalls"] != 3 || locals["timebox.Refuse"] != 0 {
		t.Errorf("local activities %v: want the refusals in 3 RefuseCalls", locals)
	}
}
