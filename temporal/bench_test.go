package temporal_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/sdk/client"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/temporal"
)

// BenchmarkTurns runs turns of one quick exec tool call (a model step
// asking for it, the call, a model step answering) on the embedded engine
// and through Temporal with one worker and with two, one turn at a time
// and 8 at once.
// It reports turns/s, and the median and p99 of the tool call's latency as
// the turn sees it: from the end of the model step that asked for it to
// the call's tool_finished (scheduling the activity included), and of the
// whole turn.
//
//	go test ./temporal -run '^$' -bench Turns -benchtime 50x
func BenchmarkTurns(b *testing.B) {
	dir := b.TempDir()
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"tool_calls": [{"name": "quick"}]}`+"\n"+`{"text": "done"}`+"\n"), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte("name: bench\nmodel: {primary: script:m}\nproviders: {script: {file: script.jsonl}}\ntools:\n  - name: quick\n    exec: [\"true\"]\n    timeout: 5s\n"), 0o644)
	open := func() *timebox.Agent { return openAgent(b, file) }
	type runner interface {
		Run(context.Context, agent.Input, ...event.Sink) *agent.Result
	}
	var tc client.Client // the Temporal sub-benchmark's, for the breakdown
	bench := func(b *testing.B, r runner, parallel int) {
		var (
			mu        sync.Mutex
			toolLat   []time.Duration
			turnLat   []time.Duration
			wg        sync.WaitGroup
			next      = make(chan struct{})
			failed    error
			failedMsg string
			ids       []string
		)
		b.ResetTimer()
		start := time.Now()
		for range parallel {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range next {
					t0 := time.Now()
					res := r.Run(context.Background(), agent.Input{Text: "go"})
					wall := time.Since(t0)
					var asked, done time.Time
					for _, e := range res.Record.Events {
						switch d := e.Data.(type) {
						case *event.LLMFinished:
							if d.Step == 1 {
								asked = e.At
							}
						case *event.ToolFinished:
							done = e.At
						}
					}
					mu.Lock()
					ids = append(ids, res.Record.TurnID)
					if res.Record.Status != budget.StatusCompleted && failed == nil {
						failed, failedMsg = context.Canceled, res.Record.Message
					}
					turnLat = append(turnLat, wall)
					if !asked.IsZero() && !done.IsZero() {
						toolLat = append(toolLat, done.Sub(asked))
					}
					mu.Unlock()
				}
			}()
		}
		for range b.N {
			next <- struct{}{}
		}
		close(next)
		wg.Wait()
		elapsed := time.Since(start)
		b.StopTimer()
		if failed != nil {
			b.Fatalf("a turn did not complete: %s", failedMsg)
		}
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "turns/s")
		b.ReportMetric(ms(pct(toolLat, 50)), "tool-p50-ms")
		b.ReportMetric(ms(pct(toolLat, 99)), "tool-p99-ms")
		b.ReportMetric(ms(pct(turnLat, 50)), "turn-p50-ms")
		b.ReportMetric(ms(pct(turnLat, 99)), "turn-p99-ms")
		b.ReportMetric(0, "ns/op")
		if tc != nil {
			breakdown(b, tc, ids, turnLat)
		}
	}

	for _, parallel := range []int{1, 8} {
		b.Run(fmt.Sprintf("embedded/at_once=%d", parallel), func(b *testing.B) { bench(b, open(), parallel) })
		for _, workers := range []int{1, 2} {
			b.Run(fmt.Sprintf("temporal/workers=%d/at_once=%d", workers, parallel), func(b *testing.B) {
				c, s, _ := setup(b)
				tc = c
				defer func() { tc = nil }()
				queue := "bench-" + strings.ReplaceAll(b.Name(), "/", "-")
				a := open()
				for range workers {
					startWorker(b, c, s, queue, a.Agent)
				}
				r, _ := temporal.NewRunner(c, s, queue, a.Agent)
				bench(b, r, parallel)
			})
		}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// pct returns the p-th percentile of ds.
func pct(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

// breakdown reports where a Temporal turn's time goes, per turn, from the
// workflows' histories: waiting for a workflow task to start (wft-wait)
// and running it (wft-run, the model steps included: they are local
// activities), waiting for a tool call's activity to start (act-wait) and
// running it (act-run), and the rest of the turn's wall time (outside:
// starting the workflow, and following the turn through the store after
// its workflow ended).
func breakdown(b *testing.B, c client.Client, ids []string, walls []time.Duration) {
	var wftWait, wftRun, actWait, actRun, span time.Duration
	for _, id := range ids {
		var scheduled, started, actScheduled, actStarted, first, last time.Time
		it := c.GetWorkflowHistory(context.Background(), temporal.WorkflowID(id), "", false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		for it.HasNext() {
			e, err := it.Next()
			if err != nil {
				b.Fatal(err)
			}
			at := e.EventTime.AsTime()
			if first.IsZero() {
				first = at
			}
			last = at
			switch e.EventType {
			case enums.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
				scheduled = at
			case enums.EVENT_TYPE_WORKFLOW_TASK_STARTED:
				started = at
				wftWait += at.Sub(scheduled)
			case enums.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
				wftRun += at.Sub(started)
			case enums.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
				actScheduled = at
			case enums.EVENT_TYPE_ACTIVITY_TASK_STARTED:
				actStarted = at
				actWait += at.Sub(actScheduled)
			case enums.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
				actRun += at.Sub(actStarted)
			}
		}
		span += last.Sub(first)
	}
	var wall time.Duration
	for _, w := range walls {
		wall += w
	}
	n := float64(len(ids))
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / n }
	b.ReportMetric(per(wftWait), "wft-wait-ms")
	b.ReportMetric(per(wftRun), "wft-run-ms")
	b.ReportMetric(per(actWait), "act-wait-ms")
	b.ReportMetric(per(actRun), "act-run-ms")
	b.ReportMetric(per(wall-span), "outside-ms")
}

// BenchmarkManyCalls runs a turn whose model replies once with
// TB_BENCH_CALLS (10,000) calls of an exec tool (`true`) under the default
// max_tool_calls (50), on the embedded engine and through Temporal (one
// worker), both with the PostgreSQL store: 50 calls run, the rest are
// refused at once. It reports the turn's wall time, and for Temporal the
// local activities (markers) and events of the workflow's history, and
// the refusals' share of them (issue 29).
//
//	go test ./temporal -run '^$' -bench ManyCalls -benchtime 1x
func BenchmarkManyCalls(b *testing.B) {
	n := 10000
	if v := os.Getenv("TB_BENCH_CALLS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	file := manyCallsAgent(b.TempDir(), n, "")
	a := openAgent(b, file)
	c, s, queue := setup(b)
	check := func(b *testing.B, rec *event.Turn) {
		b.Helper()
		if rec.StopReason != budget.MaxToolCalls {
			b.Fatalf("stopped %s: %s", rec.StopReason, rec.Message)
		}
		stored, err := s.Turn(context.Background(), rec.TurnID)
		if err != nil {
			b.Fatal(err)
		}
		refused := 0
		for _, tc := range stored.ToolCalls {
			if tc.Refused == machine.RefusedLimit {
				refused++
			}
		}
		if len(stored.ToolCalls) != n || refused != n-50 {
			b.Fatalf("%d records, %d refused; want %d, %d", len(stored.ToolCalls), refused, n, n-50)
		}
		evs, err := s.Events(context.Background(), rec.TurnID, 0, 0)
		if err != nil {
			b.Fatal(err)
		}
		finished := 0
		for _, e := range evs {
			if _, ok := e.Data.(*event.ToolFinished); ok {
				finished++
			}
		}
		if finished != n {
			b.Fatalf("%d tool_finished events, want %d", finished, n)
		}
	}
	b.Run("embedded", func(b *testing.B) {
		for b.Loop() {
			id := fmt.Sprintf("t_many_%d", time.Now().UnixNano())
			rec := store.NewRecorder(s)
			t0 := time.Now()
			if err := rec.Begin(context.Background(), store.TurnStart{TurnID: id, Engine: "embedded", StartedAt: t0}); err != nil {
				b.Fatal(err)
			}
			res := a.Run(context.Background(), agent.Input{TurnID: id, Text: "hi"}, rec)
			if err := rec.Finish(context.Background(), res.Record, res.Messages); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(ms(time.Since(t0)), "wall-ms")
			check(b, res.Record)
		}
	})
	b.Run("temporal", func(b *testing.B) {
		startWorker(b, c, s, queue, a.Agent)
		r, err := temporal.NewRunner(c, s, queue, a.Agent)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			t0 := time.Now()
			res := r.Run(context.Background(), agent.Input{Text: "hi"})
			b.ReportMetric(ms(time.Since(t0)), "wall-ms")
			check(b, res.Record)
			h := readHistory(b, c, temporal.WorkflowID(res.Record.TurnID))
			locals := 0
			for _, n := range h.Locals {
				locals += n
			}
			b.ReportMetric(float64(h.Locals["timebox.Refuse"]+h.Locals["timebox.RefuseCalls"]), "refusing-local-activities")
			b.ReportMetric(float64(locals), "local-activities")
			b.ReportMetric(float64(h.Activities), "activities")
			b.ReportMetric(float64(h.Runs), "runs")
			b.ReportMetric(float64(h.Events), "history-events")
			b.ReportMetric(float64(h.Bytes)/1e6, "history-MB")
		}
	})
}
