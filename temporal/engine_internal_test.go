package temporal

import "testing"

// TestEngineOn: a turn on the default task queue is stored as run by
// Engine, as every turn stored before the queue was part of its engine,
// so that a gateway of the default queue adopts those; one on another
// queue names it.
func TestEngineOn(t *testing.T) {
	for _, tc := range []struct{ queue, want string }{
		{"", Engine},
		{DefaultTaskQueue, Engine},
		{"billing", Engine + "/billing"},
	} {
		if got := engineOn(tc.queue); got != tc.want {
			t.Errorf("engineOn(%q) = %q, want %q", tc.queue, got, tc.want)
		}
	}
}
