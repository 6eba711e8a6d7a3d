package telemetry_test

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/script"
	"github.com/timebox-run/timebox/tool"
)

// BenchmarkTurn measures what tracing costs: the same turn — a model step
// asking for 10 Go tool calls, then the answer: 13 spans — untraced, and
// traced by the SDK with its batching processor (the exporter discards,
// so the cost is timebox's and the SDK's, not the network's). The
// difference divided by 13 is the cost of tracing one call
// (docs/BENCHMARKS.md).
func BenchmarkTurn(b *testing.B) {
	calls := make([]string, 10)
	for i := range calls {
		calls[i] = `{"name": "noop"}`
	}
	lines := `{"tool_calls": [` + strings.Join(calls, ", ") + `]}` + "\n" + `{"text": "done"}`
	newAgent := func(tp trace.TracerProvider) *agent.Agent {
		ls, err := script.Parse(strings.NewReader(lines), "bench")
		if err != nil {
			b.Fatal(err)
		}
		p, err := script.New(ls)
		if err != nil {
			b.Fatal(err)
		}
		a, err := agent.New(agent.Config{Name: "bench", TracerProvider: tp,
			Models: []model.Endpoint{{Provider: p, ProviderName: "script", Model: "m"}},
			Tools: []agent.Tool{{Tool: tool.NewFunc("noop", "does nothing", nil,
				func(context.Context, json.RawMessage, tool.Progress) (any, error) { return "ok", nil })}}})
		if err != nil {
			b.Fatal(err)
		}
		return a
	}
	run := func(b *testing.B, tp trace.TracerProvider) {
		a := newAgent(tp)
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			// A session of its own per turn: the script plays from its
			// first line for each conversation.
			res := a.Run(context.Background(), agent.Input{Text: "go", SessionID: strconv.Itoa(i)})
			if res.Record.Status != "completed" {
				b.Fatalf("%s: %s", res.Record.Status, res.Record.Message)
			}
		}
	}
	b.Run("untraced", func(b *testing.B) { run(b, nil) })
	b.Run("traced", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
		defer tp.Shutdown(context.Background())
		run(b, tp)
	})
}
