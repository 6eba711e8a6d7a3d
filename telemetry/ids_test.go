package telemetry

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/trace"

	"github.com/timebox-run/timebox/internal/spanid"
)

// TestIDsAskedFor: a span whose context asks for ids (a turn's span made
// again by the process that ends the turn) gets them, with a parent or
// without; any other gets new random ones.
func TestIDsAskedFor(t *testing.T) {
	tid, _ := trace.TraceIDFromHex("0af7651916cd43dd8448eb211c80319c")
	sid, _ := trace.SpanIDFromHex("b7ad6b7169203331")
	ctx := spanid.With(context.Background(), tid, sid)
	if gt, gs := (IDs{}).NewIDs(ctx); gt != tid || gs != sid {
		t.Errorf("NewIDs gave %s/%s; want %s/%s", gt, gs, tid, sid)
	}
	if gs := (IDs{}).NewSpanID(ctx, tid); gs != sid {
		t.Errorf("NewSpanID gave %s; want %s", gs, sid)
	}
	seen := map[trace.SpanID]bool{}
	for range 1000 {
		gt, gs := IDs{}.NewIDs(context.Background())
		s2 := IDs{}.NewSpanID(context.Background(), gt)
		if !gt.IsValid() || !gs.IsValid() || !s2.IsValid() || gt == tid || seen[gs] || seen[s2] {
			t.Fatalf("random ids %s/%s, %s: invalid or repeated", gt, gs, s2)
		}
		seen[gs], seen[s2] = true, true
	}
}
