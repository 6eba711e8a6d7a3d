// Package spanid lets a span be made again with the ids it was given at
// its start: the span of a turn whose process died before it could end it
// is made by the process that ends the turn (docs/decisions/turn-span-of-a-lost-turn.md),
// and the spans of the turn's calls, already exported, name its id as
// their parent. The ids are asked for in a context (With); the
// TracerProvider's IDGenerator gives them (package telemetry's does; one
// that does not know this package gives new ids, and the span is not made).
package spanid

import (
	"context"

	"go.opentelemetry.io/otel/trace"
)

type key struct{}

type ids struct {
	trace trace.TraceID
	span  trace.SpanID
}

// With returns ctx asking the span started under it for the ids t and s:
// s always, t when the span has no parent (a span with a parent is in its
// parent's trace).
func With(ctx context.Context, t trace.TraceID, s trace.SpanID) context.Context {
	return context.WithValue(ctx, key{}, ids{t, s})
}

// From returns the ids asked for in ctx, and whether there are.
func From(ctx context.Context) (trace.TraceID, trace.SpanID, bool) {
	v, ok := ctx.Value(key{}).(ids)
	if !ok || !v.span.IsValid() {
		return trace.TraceID{}, trace.SpanID{}, false
	}
	return v.trace, v.span, true
}
