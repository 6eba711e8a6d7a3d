//go:build linux

package mcpserve_test

import (
	"context"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/mcpserve"
)

// TestCallsAreTraced: each call that runs is an execute_tool span, the
// child of the traceparent the client sent in _meta, with the budget it ran
// under and how it ended; a timeout is an error span of phase tool.
func TestCallsAreTraced(t *testing.T) {
	proctest.AfterTest(t)
	_, a := openAgent(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	s, err := mcpserve.New(a.Tools(), mcpserve.Options{TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, st) }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1"}, nil).Connect(context.Background(), ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		cs.Close()
		stop()
		<-served
	}()
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	p := &mcp.CallToolParams{Name: "echo", Arguments: map[string]any{"text": "hi"},
		Meta: mcp.Meta{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"}}
	if r, err := cs.CallTool(context.Background(), p); err != nil || r.IsError {
		t.Fatalf("echo: %v %+v", err, r)
	}
	if r, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "hang", Arguments: map[string]any{}}); err != nil || !r.IsError {
		t.Fatalf("hang: %v %+v", err, r)
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want one per call", len(spans))
	}
	attrs := func(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
		m := map[attribute.Key]attribute.Value{}
		for _, kv := range s.Attributes() {
			m[kv.Key] = kv.Value
		}
		return m
	}
	echo, hang := spans[0], spans[1]
	if echo.Name() != "execute_tool echo" || echo.SpanContext().TraceID().String() != traceID || echo.Parent().SpanID().String() != "00f067aa0ba902b7" {
		t.Errorf("echo's span %q in trace %s, parent %s: want the client's traceparent's child", echo.Name(), echo.SpanContext().TraceID(), echo.Parent().SpanID())
	}
	if m := attrs(echo); m["gen_ai.operation.name"].AsString() != "execute_tool" || m["timebox.outcome"].AsString() != "ok" ||
		m["timebox.budget.ms"].AsInt64() != 10000 || m["timebox.budget.source"].AsString() != "tool" || m["gen_ai.tool.type"].AsString() != "function" {
		t.Errorf("echo's attributes: %v", m)
	}
	if m := attrs(hang); hang.Status().Code != codes.Error || m["error.type"].AsString() != "timed_out" || m["timebox.phase"].AsString() != "tool" ||
		m["timebox.budget.knob"].AsString() != "tools[hang].timeout in agent.yaml" {
		t.Errorf("hang's span: status %v, attributes %v", hang.Status(), m)
	}
	if hang.Parent().IsValid() {
		t.Errorf("hang's span has parent %s: the client sent no traceparent", hang.Parent().SpanID())
	}
}
