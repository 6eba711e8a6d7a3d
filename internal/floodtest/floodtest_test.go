package floodtest_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/floodtest"
	"github.com/timebox-run/timebox/internal/proctest"
)

func TestMain(m *testing.M) {
	floodtest.Main()
	goleak.VerifyTestMain(m)
}

// slowSink takes 50ms over each tool_progress event: a busy terminal or
// disk.
type slowSink struct{}

func (slowSink) Emit(e event.Event) {
	if e.Type == event.TypeToolProgress {
		time.Sleep(50 * time.Millisecond)
	}
}

// floodCases are the turns a flood is measured in.
var floodCases = []struct {
	name  string
	store bool
	total bool
	sinks []event.Sink
}{
	{name: "store off", store: false},
	{name: "store on", store: true},
	{name: "store on, with a total", store: true, total: true},
	{name: "store on, a sink taking 50ms an event", store: true, sinks: []event.Sink{slowSink{}}},
}

// floodLines is the flood: issue 9's 200,000 lines, or under the race
// detector, where the flooding program is the test binary, race detector
// and all, a quarter of it.
func floodLines() int {
	if floodtest.Race {
		return 50_000
	}
	return 200_000
}

// TestProgressFlood is issue 9's case: one call writing 200,000 progress
// lines ends ok with every report counted, its tool_progress events
// coalesced, and less than 20 MB added to the store, whether the store is
// on or off and however slow a sink is. Under the race detector each case
// has 50,000 lines.
//
// How long the call takes against the program alone is speed, measured
// where the machine is the test's alone: the fault suite's progress flood
// holds it to less than 2× the piped floor (docs/decisions/flood-floor.md),
// and BenchmarkProgressFlood gives the figures of docs/BENCHMARKS.md. This
// test held it too, on the quickest of up to five runs, and failed on a
// shared machine at load 5 to 15 (2.45× the piped floor) with nothing
// wrong in timebox. The figures of its one run are logged (go test -v).
func TestProgressFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real floods for several seconds")
	}
	proctest.AfterTest(t)
	for _, tc := range floodCases {
		t.Run(tc.name, func(t *testing.T) {
			lines := floodLines()
			// Issue 9's 10s is the fault suite's and the benchmark's: here
			// a timeout would only say the machine was busy.
			o := floodtest.Options{Lines: lines, Total: tc.total, Sinks: tc.sinks, Timeout: time.Minute}
			if tc.store {
				o.Store = floodtest.TempStore(t)
			}
			f := floodtest.Measure(t, o)
			t.Logf("%s (%.2f× piped)", f, f.PipedRatio())
			if f.Outcome != event.OutcomeOK || f.ProgressCount != lines {
				t.Fatalf("the call ended %s with %d reports counted; want ok and %d", f.Outcome, f.ProgressCount, lines)
			}
			// The first report, then one per 100ms or per new percent,
			// and the last.
			if limit := 1 + 101 + int(f.Call/(100*time.Millisecond)) + 1; f.ProgressEvents > limit {
				t.Fatalf("%d tool_progress events for a %s call; at most %d", f.ProgressEvents, f.Call, limit)
			}
			if f.StoreGrowth > 20<<20 {
				t.Fatalf("the store grew by %d bytes", f.StoreGrowth)
			}
		})
	}
}

// BenchmarkProgressFlood measures issue 9's flood in each case: the
// program alone, into a plain pipe reader (the floor of any reader) and as
// a call in a turn, each b.N times. It reports the quickest of each, and
// the call's ratio to the piped floor, which the fault suite holds to less
// than 2× (docs/decisions/flood-floor.md):
//
//	go test -run '^$' -bench ProgressFlood -benchtime 3x ./internal/floodtest/
func BenchmarkProgressFlood(b *testing.B) {
	for _, tc := range floodCases {
		b.Run(tc.name, func(b *testing.B) {
			lines := floodLines()
			var best floodtest.Figures
			for i := 0; b.Loop(); i++ {
				o := floodtest.Options{Lines: lines, Total: tc.total, Sinks: tc.sinks}
				if tc.store {
					o.Store = floodtest.TempStore(b)
				}
				f := floodtest.Measure(b, o)
				if f.Outcome != event.OutcomeOK || f.ProgressCount != lines {
					b.Fatalf("the call ended %s with %d reports counted; want ok and %d", f.Outcome, f.ProgressCount, lines)
				}
				if i == 0 {
					best = f
				}
				best.Alone, best.Piped, best.Call = min(best.Alone, f.Alone), min(best.Piped, f.Piped), min(best.Call, f.Call)
			}
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			b.ReportMetric(ms(best.Alone), "alone-ms")
			b.ReportMetric(ms(best.Piped), "piped-ms")
			b.ReportMetric(ms(best.Call), "call-ms")
			b.ReportMetric(best.PipedRatio(), "call/piped")
			b.ReportMetric(best.Ratio(), "call/alone")
		})
	}
}
