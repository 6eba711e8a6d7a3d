package telemetry

import (
	"context"
	"encoding/binary"
	"math/rand/v2"

	"go.opentelemetry.io/otel/trace"

	"github.com/timebox-run/timebox/internal/spanid"
)

// IDs is the IDGenerator of the TracerProvider FromEnv makes: random ids,
// as the SDK's own, except for a span whose ids its context asks for
// (package spanid) — the span of a turn made again by the process that
// ends it, when the one that began it died. A program with a
// TracerProvider of its own may give it sdktrace.WithIDGenerator(IDs{})
// for the same.
type IDs struct{}

// NewIDs returns the ids of a span without a parent.
func (IDs) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if t, s, ok := spanid.From(ctx); ok && t.IsValid() {
		return t, s
	}
	var t trace.TraceID
	for !t.IsValid() {
		binary.NativeEndian.PutUint64(t[:8], rand.Uint64())
		binary.NativeEndian.PutUint64(t[8:], rand.Uint64())
	}
	return t, newSpanID()
}

// NewSpanID returns the id of a span of trace t, with a parent.
func (IDs) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if _, s, ok := spanid.From(ctx); ok {
		return s
	}
	return newSpanID()
}

func newSpanID() trace.SpanID {
	var s trace.SpanID
	for !s.IsValid() {
		binary.NativeEndian.PutUint64(s[:], rand.Uint64())
	}
	return s
}
