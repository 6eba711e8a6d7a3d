package timebox_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctest"
)

// Issue 10's case, as a user meets it: an exec tool prints 100 MB, with
// every limit at its default (max_tool_output 1MiB, compact_at 100000).
// The scripted turn answers with the reply the script meant for it, with at
// most one compaction — in fact none: one step's results are sent within
// half of compact_at.
func TestHundredMegabyteToolResultWithDefaultLimits(t *testing.T) {
	proctest.AfterTest(t)
	dir := t.TempDir()
	script := `{"tool_calls": [{"name": "dump", "arguments": {}}]}
{"text": "It printed a lot."}
`
	if err := os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(path, []byte(`name: big
model:
  primary: script:demo
providers:
  script:
    file: script.jsonl
tools:
  - name: dump
    description: Prints 100 MB.
    exec: [sh, -c, "yes 0123456789abcdef | head -c 100000000"]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	a, err := timebox.Open(t.Context(), path, timebox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if a.Config.Context.CompactAt != 100000 || a.Limits().MaxToolOutput.N != 1<<20 {
		t.Fatalf("defaults: compact_at %d, max_tool_output %d", a.Config.Context.CompactAt, a.Limits().MaxToolOutput.N)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var evs events
	res := a.Run(ctx, agent.Input{Text: "dump it"}, &evs)
	rec := res.Record
	if rec.StopReason != budget.Answered || rec.Answer != "It printed a lot." || rec.Steps != 2 {
		t.Fatalf("got %s after %d steps: %s", rec.StopReason, rec.Steps, rec.Message)
	}
	compactions := 0
	for _, e := range evs.l {
		if e.Type == event.TypeCompactionStarted {
			compactions++
		}
	}
	if compactions > 1 {
		t.Fatalf("%d compactions", compactions)
	}
	if len(rec.ToolCalls) != 1 || !rec.ToolCalls[0].Truncated || rec.ToolCalls[0].Outcome != event.OutcomeOK ||
		!strings.HasPrefix(rec.ToolCalls[0].Result, "0123456789abcdef") || len(rec.ToolCalls[0].Result) < 1<<20 {
		t.Fatalf("tool call record: truncated %v, outcome %s, %d bytes", rec.ToolCalls[0].Truncated, rec.ToolCalls[0].Outcome, len(rec.ToolCalls[0].Result))
	}
	t.Logf("answered in %s with %d compaction(s)", time.Duration(rec.WallMS)*time.Millisecond, compactions)
}
