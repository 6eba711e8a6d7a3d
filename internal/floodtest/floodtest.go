// Package floodtest measures what a tool that floods timebox with progress
// reports costs it: one turn whose one exec tool call writes many
// `::progress::` lines, run the way `timebox run` runs it (store on: a
// store.Recorder over a SQLite file; store off: `--no-store`), against the
// same program run alone with stderr to /dev/null. Its own test asserts
// the figures of docs/BENCHMARKS.md; the fault suite calls Measure too.
//
// The flooding program is the test binary itself: call Main first in the
// TestMain of a package that uses Measure.
package floodtest

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/script"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/sqlite"
	"github.com/timebox-run/timebox/tool"
	"github.com/timebox-run/timebox/tool/exectool"
)

// helperArg, as the first argument, makes the test binary the flooding
// program (Main).
const helperArg = "timebox-floodtest-flood"

// Main runs the flooding program and exits if the process was started as
// one (by Measure); otherwise it returns at once. Call it first in
// TestMain.
func Main() {
	if len(os.Args) == 4 && os.Args[1] == helperArg {
		os.Exit(flood(os.Args[2], os.Args[3]))
	}
}

// flood writes n progress lines to stderr, each with its own write (as a
// program printing unbuffered to stderr does), then "done" to stdout.
func flood(arg, shape string) int {
	n, err := strconv.Atoi(arg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	buf := make([]byte, 0, 128)
	for i := 1; i <= n; i++ {
		buf = buf[:0]
		if shape == "total" {
			buf = fmt.Appendf(buf, "::progress:: {\"progress\": %d, \"total\": %d}\n", i, n)
		} else {
			buf = fmt.Appendf(buf, "::progress:: {\"message\": \"line %d\"}\n", i)
		}
		if _, err := os.Stderr.Write(buf); err != nil {
			return 1
		}
	}
	fmt.Print("done")
	return 0
}

// Options describe one measurement. The zero value is the case of issue 9:
// 200,000 lines without a total, store off, a 10s timeout.
type Options struct {
	// Lines is the number of progress lines; zero is 200,000.
	Lines int
	// Total makes each line carry progress and total ({"progress": i,
	// "total": n}); without it each is {"message": "line i"}.
	Total bool
	// Store, when set, is the path of a SQLite store the turn is written
	// to, as `timebox run --db` does; empty is `--no-store`.
	Store string
	// Sinks are more sinks for the turn's events (a slow one, say).
	Sinks []event.Sink
	// Timeout is the tool's timeout; zero is 10s.
	Timeout time.Duration
}

// Figures are what one measurement found.
type Figures struct {
	// Alone is the program's wall time with stderr to /dev/null.
	Alone time.Duration
	// Piped is its wall time with stderr to a pipe that a goroutine reads
	// and throws away: the floor of any reader, the cost of the pipe
	// itself (the writer copies each line and wakes the reader).
	Piped time.Duration
	// Call is the tool call's duration in the turn (its record).
	Call time.Duration
	// Turn is the whole turn, storing its record included.
	Turn time.Duration
	// Outcome is the call's outcome.
	Outcome event.Outcome
	// ProgressCount is the record's progress_count; ProgressEvents the
	// tool_progress events the turn emitted.
	ProgressCount, ProgressEvents int
	// StoreGrowth is how much the store's files (database and WAL) grew
	// over the turn, in bytes; zero with the store off.
	StoreGrowth int64
}

// Ratio is Call over Alone: what the flood costs the call.
func (f Figures) Ratio() float64 { return float64(f.Call) / float64(f.Alone) }

// PipedRatio is Call over Piped: what the call costs beyond the floor of
// any reader of the flood, the pipe itself.
func (f Figures) PipedRatio() float64 { return float64(f.Call) / float64(f.Piped) }

func (f Figures) String() string {
	return fmt.Sprintf("alone %s, piped %s, call %s (%.2f×), turn %s, %s, %d reports → %d tool_progress events, store +%.1f MB",
		f.Alone.Round(time.Millisecond), f.Piped.Round(time.Millisecond), f.Call.Round(time.Millisecond), f.Ratio(), f.Turn.Round(time.Millisecond),
		f.Outcome, f.ProgressCount, f.ProgressEvents, float64(f.StoreGrowth)/(1<<20))
}

// Measure runs the program alone, then one turn whose only tool call runs
// it, and returns the figures. It fails t if something cannot be set up.
func Measure(t testing.TB, o Options) Figures {
	t.Helper()
	if o.Lines == 0 {
		o.Lines = 200_000
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	shape := "message"
	if o.Total {
		shape = "total"
	}
	argv := []string{self, helperArg, strconv.Itoa(o.Lines), shape}

	var f Figures
	alone := exec.Command(argv[0], argv[1:]...) // stdout and stderr: /dev/null
	start := time.Now()
	if err := alone.Run(); err != nil {
		t.Fatalf("the flooding program alone: %v", err)
	}
	f.Alone = time.Since(start)
	if f.Piped, err = piped(argv); err != nil {
		t.Fatalf("the flooding program into a pipe: %v", err)
	}

	flood, err := exectool.New(exectool.Config{Spec: tool.Spec{Name: "flood", Description: "floods"}, Argv: argv})
	if err != nil {
		t.Fatal(err)
	}
	lines, err := script.Parse(strings.NewReader(`{"tool_calls": [{"name": "flood", "arguments": {}}]}`+"\n"+`{"text": "done"}`), "flood")
	if err != nil {
		t.Fatal(err)
	}
	p, err := script.New(lines)
	if err != nil {
		t.Fatal(err)
	}
	a, err := agent.New(agent.Config{Name: "flood", Models: []model.Endpoint{{Provider: p, ProviderName: "script", Model: "flood"}},
		Tools: []agent.Tool{{Tool: flood, Budget: budget.ToolBudget{
			Timeout: budget.Duration{D: o.Timeout, Source: budget.SourceTool, Knob: "tools[flood].timeout"}}}}})
	if err != nil {
		t.Fatal(err)
	}

	count := &counter{}
	sinks := append([]event.Sink{count}, o.Sinks...)
	ctx := context.Background()
	in := agent.Input{TurnID: agent.NewTurnID(), Text: "flood"}
	var st *sqlite.Store
	var rec *store.Recorder
	var before int64
	if o.Store != "" {
		if st, err = sqlite.Open(o.Store, sqlite.Options{}); err != nil {
			t.Fatal(err)
		}
		before = size(o.Store)
		rec = store.NewRecorder(st)
		if err := rec.Begin(ctx, store.TurnStart{TurnID: in.TurnID, Input: in.Text, StartedAt: time.Now()}); err != nil {
			st.Close()
			t.Fatal(err)
		}
		sinks = append([]event.Sink{rec}, sinks...)
	}
	start = time.Now()
	res := a.Run(ctx, in, sinks...)
	if rec != nil {
		if err := rec.Finish(ctx, res.Record, res.Messages); err != nil {
			t.Errorf("storing the turn: %v", err)
		}
	}
	f.Turn = time.Since(start)
	if st != nil {
		f.StoreGrowth = size(o.Store) - before
		if err := st.Close(); err != nil {
			t.Errorf("closing the store: %v", err)
		}
		f.StoreGrowth = max(f.StoreGrowth, size(o.Store)-before)
	}
	if len(res.Record.ToolCalls) != 1 {
		t.Fatalf("the turn ended %s without its call: %s", res.Record.StopReason, res.Record.Message)
	}
	tc := res.Record.ToolCalls[0]
	f.Call = tc.EndedAt.Sub(tc.StartedAt)
	f.Outcome = tc.Outcome
	f.ProgressCount = tc.ProgressCount
	f.ProgressEvents = count.progress
	return f
}

// piped runs argv with stderr to a pipe that is read and thrown away, and
// returns its wall time.
func piped(argv []string) (time.Duration, error) {
	c := exec.Command(argv[0], argv[1:]...)
	r, err := c.StderrPipe()
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := c.Start(); err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, r)
	err = c.Wait()
	return time.Since(start), err
}

// size returns the bytes of a SQLite store's files: the database and its
// write-ahead log.
func size(path string) int64 {
	var n int64
	for _, p := range []string{path, path + "-wal"} {
		if fi, err := os.Stat(p); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// counter counts tool_progress events. Events come one at a time.
type counter struct{ progress int }

func (c *counter) Emit(e event.Event) {
	if e.Type == event.TypeToolProgress {
		c.progress++
	}
}

// TempStore returns the path of a new store file in a test's temporary
// directory.
func TempStore(t testing.TB) string { return filepath.Join(t.TempDir(), "timebox.db") }
