package mcpserve

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/tool"
)

// A served call's span is an execute_tool span with the attributes a
// turn's call has (docs/observability.md), without an invoke_agent span
// above it: no agent runs. Its parent is the span of the traceparent the
// client sent in the request's _meta, if any, so that a traced client
// sees the call inside its own trace; the tool gets the call span's
// traceparent (an exec tool's TRACEPARENT, an MCP server's _meta).

// instrumentation names the tracer, as the agent's does.
const instrumentation = "github.com/timebox-run/timebox"

// startSpan starts the call's span, or returns nil without a tracer, and
// the traceparent the tool is to be given.
func (s *Server) startSpan(meta map[string]any, e *entry, callID, session string) (trace.Span, string) {
	if s.tracer == nil {
		return nil, ""
	}
	parent := context.Background()
	if tp, ok := meta["traceparent"].(string); ok {
		parent = agent.WithTraceParent(parent, tp)
	}
	kind := string(e.Tool.Tool.Kind())
	toolType := "function"
	if kind == string(tool.KindMCP) {
		toolType = "extension"
	}
	b := e.Budget
	attrs := []attribute.KeyValue{
		attribute.String("gen_ai.operation.name", "execute_tool"),
		attribute.String("gen_ai.tool.name", e.spec.Name),
		attribute.String("gen_ai.tool.call.id", callID),
		attribute.String("gen_ai.tool.type", toolType),
		attribute.String("gen_ai.conversation.id", session),
		attribute.String("timebox.enforcement", string(b.Enforcement)),
		attribute.Int64("timebox.budget.ms", b.Timeout.MS()),
		attribute.String("timebox.budget.source", string(b.Timeout.Source)),
		attribute.String("timebox.budget.knob", b.Timeout.Knob),
	}
	ctx, span := s.tracer.Start(parent, "execute_tool "+e.spec.Name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
	return span, agent.TraceParent(ctx)
}

// progressEvent adds a progress report to the call's span, as a turn's
// call span has them.
func progressEvent(span trace.Span, r tool.Report) {
	if span == nil {
		return
	}
	attrs := []attribute.KeyValue{attribute.String("timebox.progress.message", r.Message)}
	if r.Progress != nil {
		attrs = append(attrs, attribute.Float64("timebox.progress", *r.Progress))
	}
	if r.Total != nil {
		attrs = append(attrs, attribute.Float64("timebox.progress.total", *r.Total))
	}
	span.AddEvent("progress", trace.WithAttributes(attrs...))
}

// endSpan ends a call's span with how it went: error.type and an error
// status for every outcome but ok, as a turn's call span.
func endSpan(span trace.Span, rec event.ToolCall) {
	if span == nil {
		return
	}
	span.SetAttributes(attribute.String("timebox.outcome", string(rec.Outcome)),
		attribute.Bool("timebox.overran", rec.Overran), attribute.Bool("timebox.abandoned", rec.Abandoned))
	if rec.Phase != "" {
		span.SetAttributes(attribute.String("timebox.phase", string(rec.Phase)))
	}
	if rec.ExitCode != nil {
		span.SetAttributes(attribute.Int("process.exit.code", *rec.ExitCode))
	}
	if rec.ServerRestarted {
		span.SetAttributes(attribute.Bool("timebox.server_restarted", true))
	}
	if rec.Outcome != event.OutcomeOK {
		span.SetAttributes(attribute.String("error.type", string(rec.Outcome)))
		msg := rec.Result
		if len(msg) > 500 {
			msg = msg[:500]
		}
		span.SetStatus(codes.Error, msg)
	}
	span.End(trace.WithTimestamp(rec.EndedAt))
}
