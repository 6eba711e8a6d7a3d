package tool_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/tool"
)

// report is one progress report a test tool makes: at, from the call's
// start; progress and total when set (total 0 means none).
type report struct {
	at              time.Duration
	progress, total float64
}

// delivered is one report as OnProgress received it: when, and which
// report (its index in the tool's list, carried in Message).
type delivered struct {
	at time.Duration
	n  int
}

func (d delivered) String() string { return fmt.Sprintf("#%d@%s", d.n, d.at) }

// every returns n reports step apart from start, with progress i+1 of
// total (none when total is 0).
func every(start, step time.Duration, n int, total float64) []report {
	out := make([]report, n)
	for i := range out {
		out[i] = report{at: start + time.Duration(i)*step, progress: float64(i + 1), total: total}
	}
	return out
}

// reportingTool makes the reports at their times and returns at end.
func reportingTool(reports []report, end time.Duration) fake {
	return fake{tool.KindGo, func(ctx context.Context, c *tool.Call) (*tool.Result, error) {
		start := time.Now()
		for i, r := range reports {
			time.Sleep(r.at - time.Since(start))
			rep := tool.Report{Message: fmt.Sprint(i)}
			if r.total > 0 {
				p, t := r.progress, r.total
				rep.Progress, rep.Total = &p, &t
			}
			c.Progress.Report(rep)
		}
		time.Sleep(end - time.Since(start))
		return &tool.Result{Output: []byte("done")}, nil
	}}
}

// TestProgressCoalescing: OnProgress gets the first report, then at most
// one every ProgressInterval or one per new whole percent of the total,
// and always the last one; the count is every report.
func TestProgressCoalescing(t *testing.T) {
	cases := []struct {
		name    string
		reports []report
		end     time.Duration
		want    []delivered // nil: check wantN and the last only
		wantN   int
	}{
		{name: "one report", reports: every(0, 0, 1, 0), end: 50 * ms,
			want: []delivered{{0, 0}}},
		{name: "a burst: the first at once, the last at the end", reports: every(0, 10*ms, 3, 0), end: 30 * ms,
			want: []delivered{{0, 0}, {30 * ms, 2}}},
		{name: "a held report goes out when its window opens", reports: every(0, 10*ms, 2, 0), end: 500 * ms,
			want: []delivered{{0, 0}, {100 * ms, 1}}},
		{name: "a report after a quiet window goes out at once", reports: []report{{at: 0}, {at: 150 * ms}, {at: 400 * ms}}, end: 500 * ms,
			want: []delivered{{0, 0}, {150 * ms, 1}, {400 * ms, 2}}},
		// Reports at 0, 0.5ms, 1.5ms, ...: none at the instant a window
		// opens, so that which comes first is never a tie.
		{name: "a flood without a total: one per 100ms, then the last", reports: append([]report{{}}, every(ms/2, ms, 999, 0)...), end: 1050 * ms,
			want: []delivered{{0, 0}, {100 * ms, 100}, {200 * ms, 200}, {300 * ms, 300}, {400 * ms, 400}, {500 * ms, 500},
				{600 * ms, 600}, {700 * ms, 700}, {800 * ms, 800}, {900 * ms, 900}, {1000 * ms, 999}}},
		{name: "a window moved by a percent step holds the next report longer",
			reports: []report{{at: 0, progress: 0, total: 100}, {at: 50 * ms, progress: 0.5, total: 100},
				{at: 60 * ms, progress: 1, total: 100}, {at: 70 * ms, progress: 1.5, total: 100}}, end: 300 * ms,
			// #1 is held for 100ms; #2 reaches 1% and goes at once, which
			// restarts the window: #3 (replacing #1) waits until 160ms.
			want: []delivered{{0, 0}, {60 * ms, 2}, {160 * ms, 3}}},
		// 200 reports of a total of 200, 1ms apart: 0% (the first), then
		// each new percent (every other report) as it is reached; the
		// 100ms window adds nothing on top.
		{name: "a total: one per new whole percent", reports: every(0, ms, 200, 200), end: 300 * ms, wantN: 101},
		// Going back and forth never reaches a new percent: only the
		// 100ms window lets reports through.
		{name: "progress going backwards does not flood", reports: func() []report {
			r := every(0, ms, 1000, 100)
			for i := range r {
				r[i].progress = float64(50 * (1 - i%2))
			}
			return r
		}(), end: 1050 * ms, wantN: 11},
		// Progress 1..1000 of 10: the first ten are each a new percent,
		// the rest are none.
		{name: "progress beyond its total does not flood", reports: every(0, ms, 1000, 10), end: 1050 * ms, wantN: 10 + 9 + 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var mu sync.Mutex
				var got []delivered
				start := time.Now()
				x := tool.Run(t.Context(), reportingTool(tc.reports, tc.end), &tool.Call{Tool: "t"}, tb(time.Hour, budget.Cooperative),
					tool.Hooks{OnProgress: func(r tool.Report) {
						var n int
						fmt.Sscan(r.Message, &n)
						mu.Lock()
						defer mu.Unlock()
						got = append(got, delivered{time.Since(start), n})
					}})
				if x.Outcome != event.OutcomeOK || x.Progress != len(tc.reports) {
					t.Fatalf("outcome %s, progress count %d, want ok and %d", x.Outcome, x.Progress, len(tc.reports))
				}
				if tc.want != nil && fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Fatalf("delivered\n%v\nwant\n%v", got, tc.want)
				}
				if tc.wantN != 0 && len(got) != tc.wantN {
					t.Fatalf("%d delivered, want %d: %v", len(got), tc.wantN, got)
				}
				if last := got[len(got)-1]; last.n != len(tc.reports)-1 {
					t.Fatalf("last delivered is #%d, want the last report #%d", last.n, len(tc.reports)-1)
				}
				for i := 1; i < len(got); i++ {
					if got[i].n <= got[i-1].n {
						t.Fatalf("out of order: %v", got)
					}
				}
			})
		})
	}
}

// TestSlowProgressHookDoesNotHoldTheTool: a hook that takes a second per
// report (a slow store) neither slows the tool down nor times it out, and
// still gets the last report before Run returns.
func TestSlowProgressHookDoesNotHoldTheTool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls int
		var last string
		// 2,000 reports over 2s, under a 3s timeout.
		x := tool.Run(t.Context(), reportingTool(every(0, ms, 2000, 0), 2*time.Second), &tool.Call{Tool: "t"},
			tb(3*time.Second, budget.Hard), tool.Hooks{OnProgress: func(r tool.Report) {
				time.Sleep(time.Second)
				calls++
				last = r.Message
			}})
		if x.Outcome != event.OutcomeOK || x.Elapsed() != 2*time.Second || x.Progress != 2000 {
			t.Fatalf("outcome %s after %s with %d reports; want ok after 2s with 2000", x.Outcome, x.Elapsed(), x.Progress)
		}
		// #0 at once (until 1s), one queued meanwhile (until 2s), the
		// rest merged into the last one a window after the tool ended.
		if last != "1999" || calls > 4 {
			t.Fatalf("%d hook calls, the last with report %s; want at most 4, the last 1999", calls, last)
		}
	})
}

const ms = time.Millisecond

// TestEveryReportKeepsTheCallAlive: coalescing never delays the idle
// window or OnAlive: each report counts the moment it is made.
func TestEveryReportKeepsTheCallAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := tb(time.Hour, budget.Hard)
		b.IdleTimeout = budget.Duration{D: 50 * ms, Source: budget.SourceTool}
		var alive []time.Duration
		start := time.Now()
		// A report every 40ms for 2s: each inside the 50ms idle window,
		// though only one in 100ms reaches OnProgress.
		x := tool.Run(t.Context(), reportingTool(every(0, 40*ms, 50, 0), 2*time.Second), &tool.Call{Tool: "t"}, b,
			tool.Hooks{OnAlive: func() { alive = append(alive, time.Since(start)) }, OnProgress: func(tool.Report) {}})
		// The last report is at 1.96s: idle fires at 2.01s, after the
		// tool's return at 2s.
		if x.Outcome != event.OutcomeOK || x.Progress != 50 {
			t.Fatalf("outcome %s phase %s after %s, %d reports", x.Outcome, x.Phase, x.Elapsed(), x.Progress)
		}
		if len(alive) != 50 || alive[49] != 1960*ms {
			t.Fatalf("OnAlive called %d times, last at %v", len(alive), alive[len(alive)-1])
		}
	})
}

// TestReportKeepsNoReference: a tool may reuse what a report's pointers
// point to as soon as Report returns; OnProgress, which runs later, sees
// the values as they were reported.
func TestReportKeepsNoReference(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var got []float64
		x := tool.Run(t.Context(), fake{tool.KindGo, func(ctx context.Context, c *tool.Call) (*tool.Result, error) {
			n, total := 1.0, 3.0
			for range 3 {
				c.Progress.Report(tool.Report{Progress: &n, Total: &total})
				n++ // reused at once
			}
			n = -1
			return nil, nil
		}}, &tool.Call{Tool: "t"}, tb(time.Hour, budget.Cooperative), tool.Hooks{OnProgress: func(r tool.Report) {
			got = append(got, *r.Progress)
		}})
		if x.Progress != 3 || fmt.Sprint(got) != "[1 2 3]" {
			t.Fatalf("%d reports, OnProgress saw %v; want [1 2 3]", x.Progress, got)
		}
	})
}
