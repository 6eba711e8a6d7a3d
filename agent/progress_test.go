package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/tool"
)

// slowSink is a sink that takes d over each tool_progress event, the way
// a store on a busy disk would; with once, over the first one only.
type slowSink struct {
	recorder
	d    time.Duration
	once bool
	n    int
}

func (s *slowSink) Emit(e event.Event) {
	if e.Type == event.TypeToolProgress {
		if s.n++; s.n == 1 || !s.once {
			time.Sleep(s.d)
		}
	}
	s.recorder.Emit(e)
}

// reporter reports progress n times, every interval, then returns.
func reporter(n int, interval time.Duration) tool.Handler {
	return func(ctx context.Context, _ json.RawMessage, p tool.Progress) (any, error) {
		for i := range n {
			time.Sleep(interval)
			p.Report(tool.Report{Message: fmt.Sprint(i)})
		}
		return "done", nil
	}
}

func runWithSink(t *testing.T, sink *slowSink, b budget.Budgets, tools ...agent.Tool) *agent.Result {
	t.Helper()
	p := lines(t, `{"tool_calls": [{"name": "flood"}]}`, `{"text": "ok"}`)
	a, err := agent.New(agent.Config{Name: "test", Models: []model.Endpoint{endpoint(p, "m")}, Tools: tools, Budgets: b})
	if err != nil {
		t.Fatal(err)
	}
	res := a.Run(t.Context(), agent.Input{Text: "go"}, sink)
	checkEvents(t, res, &sink.recorder)
	return res
}

// TestSlowSinkDoesNotHoldTheTool: a sink that takes a second per
// tool_progress event does not slow a flooding tool down nor time it out;
// the events are coalesced, the count is exact, and the last report is the
// last tool_progress, before tool_finished.
func TestSlowSinkDoesNotHoldTheTool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sink := &slowSink{d: time.Second}
		// 2,000 reports over 2s, under a 3s timeout.
		res := runWithSink(t, sink, budget.Budgets{}, goTool("flood", budget.Cooperative, 3*time.Second, reporter(2000, time.Millisecond)))
		tr := toolRecord(t, res, "flood")
		if res.Record.StopReason != budget.Answered || tr.Outcome != event.OutcomeOK || tr.DurationMS != 2000 || tr.ProgressCount != 2000 {
			t.Fatalf("%s; record %+v", res.Record.StopReason, tr)
		}
		evs := sink.events
		var progress []event.Event
		for i, e := range evs {
			switch e.Type {
			case event.TypeToolProgress:
				progress = append(progress, e)
			case event.TypeToolFinished:
				if last := evs[i-1]; last.Type != event.TypeToolProgress || last.Data.(*event.ToolProgress).Message != "1999" {
					t.Fatalf("before tool_finished: %s %+v, want the last report", last.Type, last.Data)
				}
			}
		}
		if len(progress) > 4 {
			t.Fatalf("%d tool_progress events for a sink that takes 1s each over 2s", len(progress))
		}
	})
}

// TestEveryReportKeepsTheTurnAlive: the step watchdog counts each report
// the moment it is made, not when its event gets through a sink that has
// stalled.
func TestEveryReportKeepsTheTurnAlive(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// The first tool_progress event takes 3.5s to store.
		sink := &slowSink{d: 3500 * time.Millisecond, once: true}
		b := budget.Defaults()
		b.Step.D = 1500 * time.Millisecond
		// Past its 1s timeout the call is asked to stop and given a 10s
		// grace; it finishes its work instead, reporting every 300ms until
		// 4s. Only those reports keep the turn alive meanwhile.
		flood := goTool("flood", budget.Cooperative, time.Second, reporter(13, 300*time.Millisecond))
		flood.Budget.KillGrace = budget.Duration{D: 10 * time.Second}
		res := runWithSink(t, sink, b, flood)
		tr := toolRecord(t, res, "flood")
		if res.Record.StopReason != budget.Answered || tr.Outcome != event.OutcomeOK || tr.ProgressCount != 13 {
			t.Fatalf("%s: %s; record %+v", res.Record.StopReason, res.Record.Message, tr)
		}
	})
}
