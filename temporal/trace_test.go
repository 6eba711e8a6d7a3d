package temporal_test

import (
	"context"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	timebox "github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/temporal"
)

// TestTracesOnTemporal: a turn run on Temporal is one trace, as on the
// embedded engine: the runner's invoke_agent span, and under it the chat
// and execute_tool spans the worker makes, by the traceparent the turn's
// state carries to it.
func TestTracesOnTemporal(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	c, s, queue := setup(t)
	dir := t.TempDir()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	file := agentFile(t, dir, "echo slow done")
	// The worker and the runner are built apart, as in two processes.
	worker, err := timebox.Open(context.Background(), file, timebox.Options{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	defer worker.Close()
	startWorker(t, c, s, queue, worker.Agent)
	runner, err := timebox.Open(context.Background(), file, timebox.Options{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	defer runner.Close()
	r, err := temporal.NewRunner(c, s, queue, runner.Agent)
	if err != nil {
		t.Fatal(err)
	}
	res := r.Run(context.Background(), agent.Input{Text: "go"})
	if res.Record.Status != budget.StatusCompleted {
		t.Fatalf("turn ended %s: %s", res.Record.Status, res.Record.Message)
	}
	var turn sdktrace.ReadOnlySpan
	names := map[string]int{}
	for _, sp := range rec.Ended() {
		names[sp.Name()]++
		if strings.HasPrefix(sp.Name(), "invoke_agent ") {
			turn = sp
		}
	}
	if turn == nil {
		t.Fatalf("no invoke_agent span: %v", names)
	}
	if names["chat test"] != 3 || names["execute_tool quick"] != 1 || names["execute_tool hung"] != 1 || names["execute_tool slow"] != 1 {
		t.Errorf("spans %v", names)
	}
	for _, sp := range rec.Ended() {
		if sp == turn {
			continue
		}
		if sp.SpanContext().TraceID() != turn.SpanContext().TraceID() || sp.Parent().SpanID() != turn.SpanContext().SpanID() {
			t.Errorf("%s is not a child of the turn's span", sp.Name())
		}
		if sp.Name() == "execute_tool hung" {
			for _, kv := range sp.Attributes() {
				if kv.Key == "error.type" && kv.Value.AsString() != "timed_out" {
					t.Errorf("hung: error.type %s", kv.Value.AsString())
				}
			}
		}
	}
}
