package postgres

import (
	"testing"
	"time"
)

// TestAWaitIsGivenUpOnSilenceNotOnLength: a wait is due hungAfter after
// the later of its start and the database's last answer: a database that
// answered before the wait began gives it hungAfter whole, and every
// answer during it moves its end on.
func TestAWaitIsGivenUpOnSilenceNotOnLength(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 6, 0, 0, 0, time.UTC)
	now := t0
	l := newLiveness(func() time.Time { return now })
	for _, tc := range []struct {
		name     string
		answered time.Duration // when the database last answered, from t0
		start    time.Duration
		due      time.Duration
	}{
		{"silent since before the wait", 0, 3 * time.Second, 3*time.Second + hungAfter},
		{"answered during the wait", 10 * time.Second, 3 * time.Second, 10*time.Second + hungAfter},
		{"answered as it began", 3 * time.Second, 3 * time.Second, 3*time.Second + hungAfter},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now = t0.Add(tc.answered)
			l.answered()
			if got := l.due(t0.Add(tc.start)); !got.Equal(t0.Add(tc.due)) {
				t.Errorf("due %s after t0, want %s", got.Sub(t0), tc.due)
			}
		})
	}
}
