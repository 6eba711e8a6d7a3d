package temporal_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/temporal"
)

// TestServerMetricsOnTemporal: `timebox serve --engine temporal` counts
// the turns its workers run in its /metrics, as it counts its own: the
// turn by status and stop reason, each tool call's duration by outcome,
// the tool timeout that fired.
func TestServerMetricsOnTemporal(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	dir := t.TempDir()
	a := openAgent(t, agentFile(t, dir, "echo slow done"))
	startWorker(t, c, s, queue, a.Agent)
	r, err := temporal.NewRunner(c, s, queue, a.Agent)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Agent: r, AgentName: "temporal-test", Store: s, Budgets: a.Agent})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	defer srv.Shutdown(context.Background())
	res, err := http.Post(hs.URL+"/v1/turns", "application/json", strings.NewReader(`{"input": "go"}`))
	if err != nil {
		t.Fatal(err)
	}
	var rec event.Turn
	err = json.NewDecoder(res.Body).Decode(&rec)
	res.Body.Close()
	if err != nil || rec.Status != budget.StatusCompleted || len(rec.ToolCalls) != 3 {
		t.Fatalf("turn: %v, %s (%s), %d calls", err, rec.Status, rec.Message, len(rec.ToolCalls))
	}
	res, err = http.Get(hs.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	for _, want := range []string{
		`timebox_turns_total{status="completed",stop_reason="answered"} 1`,
		`timebox_tool_call_duration_seconds_count{outcome="ok",tool="quick"} 1`,
		`timebox_tool_call_duration_seconds_count{outcome="timed_out",tool="hung"} 1`,
		`timebox_tool_call_duration_seconds_count{outcome="ok",tool="slow"} 1`,
		`timebox_timeouts_total{phase="tool"} 1`,
	} {
		if !strings.Contains(string(b), want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if t.Failed() {
		t.Logf("/metrics:\n%s", b)
	}
}
