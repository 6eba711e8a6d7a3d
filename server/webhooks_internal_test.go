package server

import (
	"testing"

	"github.com/timebox-run/timebox/store"
)

// TestACutAttemptIsNotOneOfTheSchedule: attempts a stopping gateway cut
// short do not count among the schedule's (eight, docs/webhooks.md):
// before, each restart during an attempt used one up and moved the next
// wait along the schedule.
func TestACutAttemptIsNotOneOfTheSchedule(t *testing.T) {
	as := []store.DeliveryAttempt{{Status: 500}, {Error: cutByShutdown}, {Error: "no answer within 10s"}, {Error: cutByShutdown}}
	if n := madeAttempts(as); n != 2 {
		t.Fatalf("%d attempts made, want 2", n)
	}
}
