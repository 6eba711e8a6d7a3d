package budget_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
)

// TestTimeoutErrorText holds Error to the text it had when fmt wrote it.
func TestTimeoutErrorText(t *testing.T) {
	for _, e := range []*budget.TimeoutError{
		{},
		{Phase: budget.PhaseTurn, Limit: 13 * time.Second, Elapsed: 13*time.Second + 4567*time.Microsecond, Knob: "timeouts.turn", Subject: "the turn"},
		{Phase: budget.PhaseTool, Limit: time.Hour, Subject: `tool "crawl"`, Knob: "tools[crawl].timeout"},
		{Phase: budget.PhaseLLMIdle, Limit: 1500 * time.Millisecond, Elapsed: 2 * time.Minute, Source: budget.SourceFlag},
	} {
		subject := e.Subject
		if subject == "" {
			subject = "call"
		}
		want := fmt.Sprintf("%s timeout: %s exceeded %s", e.Phase, subject, e.Limit)
		if e.Elapsed > 0 {
			want += fmt.Sprintf(" (elapsed %s)", budget.Round(e.Elapsed))
		}
		if e.Knob != "" {
			want += "; change " + e.Knob
		}
		if got := e.Error(); got != want {
			t.Errorf("Error() = %q, want %q", got, want)
		}
	}
}
