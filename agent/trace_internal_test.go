package agent

import (
	"context"
	"testing"
)

// TestTraceParentRoundTrip: what WithTraceParent reads, TraceParent
// writes back the same; what is not a W3C traceparent is ignored.
func TestTraceParentRoundTrip(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if got := TraceParent(WithTraceParent(context.Background(), tp)); got != tp {
		t.Errorf("round trip: %q", got)
	}
	if got := TraceParent(WithTraceParent(context.Background(), "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-future")); got != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00" {
		t.Errorf("a later version: %q", got)
	}
	for _, bad := range []string{
		"", "garbage", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
		"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",    // upper case
		"00-00000000000000000000000000000000-00f067aa0ba902b7-01",    // zero trace id
		"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",    // zero span id
		"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",    // invalid version
		"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xx", // extra field in version 00
		"00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",    // not hex
	} {
		if got := TraceParent(WithTraceParent(context.Background(), bad)); got != "" {
			t.Errorf("%q was taken: %q", bad, got)
		}
	}
}
