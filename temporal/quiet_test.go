package temporal

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	sdklog "go.temporal.io/sdk/log"
)

// TestQuietHandOvers: the SDK's "Workflow panic" line of a workflow task a
// stopping worker failed to hand its turn over (errHandOver) is an info
// line that says so, without the stack trace; any other panic stays an
// error with everything it carried.
func TestQuietHandOvers(t *testing.T) {
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelWarn} {
		var out bytes.Buffer
		log := sdklog.NewStructuredLogger(slog.New(QuietHandOvers(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: level}))))
		// As the SDK logs it: the panic's value in the error's text.
		log.Error("Workflow panic", "WorkflowType", "timebox.Turn", "WorkflowID", "timebox-t1", "RunID", "r1", "Attempt", 1,
			"Error", fmt.Errorf("%v", errHandOver), "StackTrace", "goroutine 1 [running]: ...")
		log.Error("Workflow panic", "WorkflowID", "timebox-t2", "Error", errors.New("index out of range"), "StackTrace", "goroutine 2")
		log.Warn("something else", "k", "v")
		got := out.String()
		lines := strings.Split(strings.TrimSpace(got), "\n")
		want := 2
		if level == slog.LevelInfo {
			want = 3
			if !strings.Contains(lines[0], "level=INFO") || !strings.Contains(lines[0], "another worker takes the turn on at once") ||
				!strings.Contains(lines[0], "WorkflowID=timebox-t1") || strings.Contains(lines[0], "goroutine") {
				t.Errorf("the hand-over's line at %s: %s", level, lines[0])
			}
		} else if strings.Contains(got, "timebox-t1") {
			t.Errorf("the hand-over's line at %s is shown: %s", level, got)
		}
		if len(lines) != want || !strings.Contains(got, "level=ERROR msg=\"Workflow panic\" WorkflowID=timebox-t2") ||
			!strings.Contains(got, "goroutine 2") || !strings.Contains(got, "something else") {
			t.Errorf("at %s, got %d lines; want %d, the other panic's and the warning as they were:\n%s", level, len(lines), want, got)
		}
	}
}
