package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/doctest"
	"github.com/timebox-run/timebox/store"
)

var update = flag.Bool("update", false, "rewrite the golden files of testdata/timeline")

// readTurn reads a turn as `timebox runs show --json` wrote it: the record
// with its events.
func readTurn(t *testing.T, name string) *event.Turn {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "timeline", name))
	if err != nil {
		t.Fatal(err)
	}
	var rec event.Turn
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return &rec
}

// runningAt is rec as it was stored at, while it ran: the events until
// then, the calls that had ended.
func runningAt(rec *event.Turn, at time.Time) *event.Turn {
	r := *rec
	r.Status, r.StopReason, r.EndedAt, r.Events, r.ToolCalls, r.ModelCalls = budget.StatusRunning, "", time.Time{}, nil, nil, nil
	for _, e := range rec.Events {
		if e.At.After(at) {
			break
		}
		r.Events = append(r.Events, e)
		switch d := e.Data.(type) {
		case *event.ToolFinished:
			r.ToolCalls = append(r.ToolCalls, d.ToolCall)
		case *event.LLMFinished:
			r.ModelCalls = append(r.ModelCalls, d.ModelCall)
		case *event.CompactionFinished:
			r.ModelCalls = append(r.ModelCalls, *d.Record)
		}
	}
	return &r
}

// TestTimelineGolden draws fixed turns and compares them with
// testdata/timeline/*.txt (go test -run TestTimelineGolden -update
// rewrites them): the demo turn; a turn with every outcome, a failover, a
// compaction, a refused call, an abandoned call's late result and an
// advisory overrun, plain and in colour on a wider terminal; and the same
// turn two seconds in, still running; a Temporal turn whose worker was
// lost; and a turn whose calls waited for a person — approved, denied,
// expired — done, and two seconds in, while two of them still wait.
func TestTimelineGolden(t *testing.T) {
	demo, outcomes, lost := readTurn(t, "demo.json"), readTurn(t, "outcomes.json"), readTurn(t, "lost.json")
	approvals := readTurn(t, "approvals.json")
	twoSecondsIn := outcomes.StartedAt.Add(2 * time.Second)
	waiting := approvals.StartedAt.Add(2 * time.Second)
	for _, tc := range []struct {
		golden string
		rec    *event.Turn
		now    time.Time
		width  int
		color  bool
	}{
		{"demo.txt", demo, time.Time{}, 80, false},
		{"outcomes.txt", outcomes, time.Time{}, 80, false},
		{"outcomes-color-120.txt", outcomes, time.Time{}, 120, true},
		{"outcomes-running.txt", runningAt(outcomes, twoSecondsIn), twoSecondsIn, 80, false},
		{"lost.txt", lost, time.Time{}, 80, false},
		{"approvals.txt", approvals, time.Time{}, 80, false},
		{"approvals-waiting.txt", runningAt(approvals, waiting), waiting, 80, false},
	} {
		t.Run(tc.golden, func(t *testing.T) {
			var b bytes.Buffer
			buildTimeline(tc.rec, tc.rec.Events, tc.now).write(&b, tc.width, tc.color)
			path := filepath.Join("testdata", "timeline", tc.golden)
			if *update {
				if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if got := b.String(); got != string(want) {
				t.Errorf("the timeline of %s drawn %d wide differs from %s (-update rewrites it):\n%s", tc.rec.TurnID, tc.width, path, got)
			}
			for i, line := range strings.Split(strings.TrimSuffix(stripANSI(b.String()), "\n"), "\n") {
				if n := utf8Len(line); n > tc.width {
					t.Errorf("line %d is %d columns wide, over %d: %q", i+1, n, tc.width, line)
				}
			}
		})
	}
}

// TestTimelineRecordWithoutEvents: a record whose events are gone still
// draws every call (no ticks, no failover, no model deadline).
func TestTimelineRecordWithoutEvents(t *testing.T) {
	rec := readTurn(t, "outcomes.json")
	var b bytes.Buffer
	buildTimeline(rec, nil, time.Time{}).write(&b, 80, false)
	got := b.String()
	for _, want := range []string{"compaction", "model primary", "model fallback #2", "fetch", "web_fetch", "lint", "lookup", "report", "serch", "crawl"} {
		if !strings.Contains(got, "\n"+want+" ") {
			t.Errorf("no row %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "failover") || strings.Contains(got, "'") {
		t.Errorf("a failover or a progress tick drawn without events:\n%s", got)
	}
}

// TestTimelineWidthAndColour: the width is the terminal's (COLUMNS when
// its size cannot be read), 80 columns elsewhere; colour only on a
// terminal, and never with NO_COLOR.
func TestTimelineWidthAndColour(t *testing.T) {
	for _, tc := range []struct {
		name     string
		terminal bool
		env      []string
		width    int
		color    bool
	}{
		{"a pipe", false, []string{"COLUMNS=132"}, 80, false},
		{"a terminal", true, []string{"COLUMNS=132"}, 132, true},
		{"a terminal of unknown width", true, nil, 80, true},
		{"a narrow terminal", true, []string{"COLUMNS=20"}, 40, true},
		{"NO_COLOR", true, []string{"COLUMNS=100", "NO_COLOR=1"}, 100, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			o := IO{Out: &b, Env: tc.env, Terminal: tc.terminal}
			if w := timelineWidth(o); w != tc.width {
				t.Errorf("width %d, want %d", w, tc.width)
			}
			rec := readTurn(t, "demo.json")
			st := fakeRuns{rec: rec}
			if code := (runsStore{st: st}).timeline(t.Context(), rec.TurnID, o); code != ExitOK {
				t.Fatalf("exit %d", code)
			}
			if got := strings.Contains(b.String(), "\x1b["); got != tc.color {
				t.Errorf("colour %v, want %v:\n%s", got, tc.color, b.String())
			}
			longest := 0
			for _, line := range strings.Split(stripANSI(b.String()), "\n") {
				longest = max(longest, utf8Len(line))
			}
			if longest > tc.width || longest < tc.width-20 {
				t.Errorf("the longest line is %d columns, for a width of %d:\n%s", longest, tc.width, b.String())
			}
		})
	}
}

// fakeRuns is a store holding one turn, for `runs show` to read.
type fakeRuns struct {
	store.Store // the rest is not called
	rec         *event.Turn
}

func (f fakeRuns) Turn(context.Context, string) (*event.Turn, error) { return f.rec, nil }

func (f fakeRuns) Events(context.Context, string, int64, int) ([]event.Event, error) {
	return f.rec.Events, nil
}

func TestAxis(t *testing.T) {
	for _, tc := range []struct {
		span  int64
		n     int
		step  int64
		label string // of 3 steps
	}{
		{5042, 5, 1000, "3s"},
		{5042, 4, 2000, "6s"},
		{730, 5, 200, "600ms"},
		{90_000, 6, 15000, "45s"},
		{3 * 3600_000, 4, 3600_000, "3h"},
		{25 * 60_000, 5, 300_000, "15m"},
		{95_000, 4, 30_000, "1m30s"},
	} {
		if got := axisStep(tc.span, tc.n); got != tc.step {
			t.Errorf("axisStep(%d, %d) = %d, want %d", tc.span, tc.n, got, tc.step)
		}
		if got := axisLabel(3 * tc.step); got != tc.label {
			t.Errorf("axisLabel(%d) = %q, want %q", 3*tc.step, got, tc.label)
		}
	}
}

// TestDocsShowTheTimeline: docs/observability.md shows the demo turn's
// timeline as the golden file has it (go test ./internal/cli -run
// TestDocsShowTheTimeline -update rewrites it).
func TestDocsShowTheTimeline(t *testing.T) {
	b, err := os.ReadFile("testdata/timeline/demo.txt")
	if err != nil {
		t.Fatal(err)
	}
	id, _, _ := strings.Cut(strings.TrimPrefix(string(b), "turn "), " ")
	doctest.Part(t, "../../docs/observability.md", "timeline",
		"```console\n$ timebox runs show "+id+" --timeline\n"+string(b)+"```\n", *update,
		"go test ./internal/cli -run TestDocsShowTheTimeline -update")
}

// TestTimelineWaitsWithoutEvents: a record whose events are gone still
// draws each call's wait for a person, from its approval_ms, and says how
// it ended.
func TestTimelineWaitsWithoutEvents(t *testing.T) {
	rec := readTurn(t, "approvals.json")
	var b bytes.Buffer
	buildTimeline(rec, nil, time.Time{}).write(&b, 80, false)
	for _, want := range []string{"approved by alice", "denied by bob", "approval expired"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no %q:\n%s", want, b.String())
		}
	}
	for _, line := range strings.Split(b.String(), "\n") {
		for _, label := range []string{"deploy ", "rollback ", "wipe "} {
			if strings.HasPrefix(line, label) && !strings.Contains(line, "::") {
				t.Errorf("no wait on %q", line)
			}
		}
	}
}
