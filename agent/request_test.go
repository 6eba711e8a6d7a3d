package agent_test

import (
	"context"
	"encoding/json"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/tool"
)

// hung is a Go tool with no timeout of its own that waits until it is
// cancelled.
func hung() agent.Tool {
	return agent.Tool{Tool: tool.NewFunc("hang", "hangs", nil, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})}
}

// TestRequestBudgetsStopTheTurn: a turn whose input lowers timeouts.turn
// stops at the request's value, and turn_started, the tool's record, the
// message and turn_finished all say the value came from the request.
func TestRequestBudgetsStopTheTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := lines(t, `{"tool_calls": [{"name": "hang"}]}`, `{"text": "never"}`)
		a, err := agent.New(agent.Config{Models: []model.Endpoint{endpoint(p, "m")}, Tools: []agent.Tool{hung()}})
		if err != nil {
			t.Fatal(err)
		}
		rec := &recorder{}
		start := time.Now()
		res := a.Run(t.Context(), agent.Input{Text: "go", Budgets: budget.Request{"turn": "1500ms", "tool": "20s"}}, rec)
		checkEvents(t, res, rec)
		if took := time.Since(start); took != 1500*time.Millisecond {
			t.Errorf("the turn took %s, want 1.5s", took)
		}
		r := res.Record
		type got struct {
			StopReason budget.StopReason
			Message    string
			Limit      *event.BudgetValue
			Turn, Tool event.BudgetValue
			ToolSource budget.Source
			TimeoutMS  int64
		}
		tf := rec.ofType(event.TypeTurnFinished)[0].Data.(*event.TurnFinished)
		ts := rec.ofType(event.TypeTurnStarted)[0].Data.(*event.TurnStarted)
		tr := toolRecord(t, res, "hang")
		want := got{
			StopReason: budget.TurnTimeout,
			Message:    "Stopped after 1.5s, the limit for one turn (timeouts.turn = 1.5s (from the request)). Last step: tool hang, running for 1.5s. Try a simpler request, or raise budgets.turn in the request.",
			Limit:      &event.BudgetValue{Key: budget.KeyTurn, Value: "1.5s", MS: 1500, Source: budget.SourceRequest, Knob: "budgets.turn in the request"},
			Turn:       event.BudgetValue{Value: "1.5s", MS: 1500, Source: budget.SourceRequest, Knob: "budgets.turn in the request"},
			Tool:       event.BudgetValue{Value: "20s", MS: 20000, Source: budget.SourceRequest, Knob: "budgets.tool in the request"},
			ToolSource: budget.SourceRequest,
			TimeoutMS:  20000,
		}
		if diff := cmp.Diff(want, got{r.StopReason, r.Message, tf.Limit, ts.Budgets[budget.KeyTurn], ts.Budgets[budget.KeyTool],
			tr.TimeoutSource, tr.TimeoutMS}); diff != "" {
			t.Errorf("turn (-want +got):\n%s", diff)
		}
	})
}

// TestRequestBudgetsCeiling: a request may lower every budget it may set,
// raise one only up to RequestMax, and is refused with the name, the value
// and the ceiling otherwise.
func TestRequestBudgetsCeiling(t *testing.T) {
	p := lines(t, `{"text": "hi"}`)
	a, err := agent.New(agent.Config{Models: []model.Endpoint{endpoint(p, "m")},
		RequestMax: map[string]int64{"turn": int64(2 * time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  budget.Request
		want *budget.RequestError // nil: accepted
	}{
		{name: "lower", req: budget.Request{"turn": "1m", "step": "10s", "max_steps": "3", "max_tool_calls": "2", "tool": "5s", "llm_budget": "30s"}},
		{name: "raise to the ceiling", req: budget.Request{"turn": "2h"}},
		{name: "over the ceiling", req: budget.Request{"turn": "48h"},
			want: &budget.RequestError{Name: "turn", Asked: "48h", Ceiling: "2h"}},
		{name: "raise without a ceiling", req: budget.Request{"max_steps": "26"},
			want: &budget.RequestError{Name: "max_steps", Asked: "26", Ceiling: "25"}},
		{name: "not settable", req: budget.Request{"tool_max": "2h"},
			want: &budget.RequestError{Name: "tool_max", Asked: "2h"}},
		{name: "off", req: budget.Request{"step": "0"},
			want: &budget.RequestError{Name: "step", Asked: "0"}},
		{name: "malformed", req: budget.Request{"turn": "10 mins"},
			want: &budget.RequestError{Name: "turn", Asked: "10 mins"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, l, err := a.TurnBudgets(tc.req)
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				for name, v := range tc.req {
					k, _ := budget.KnobByName(name)
					if got := k.Value(&b, &l); got.Value != v && k.Format(mustParse(t, k, v)) != got.Value || got.Source != budget.SourceRequest {
						t.Errorf("%s = %+v, want %s from the request", name, got, v)
					}
				}
				return
			}
			re, ok := err.(*budget.RequestError)
			if !ok {
				t.Fatalf("err = %v, want a *budget.RequestError", err)
			}
			if diff := cmp.Diff(tc.want, re, cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".Msg" }, cmp.Ignore())); diff != "" {
				t.Errorf("error %q (-want +got):\n%s", re, diff)
			}
		})
	}
}

func mustParse(t *testing.T, k budget.Knob, v string) int64 {
	t.Helper()
	if k.Kind == budget.KindDuration {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		return int64(d)
	}
	var n int64
	if err := json.Unmarshal([]byte(v), &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTurnStartedDurations: turn_started writes durations as the agent
// file does (60s, 2m), not as Go's String (1m0s).
func TestTurnStartedDurations(t *testing.T) {
	p := lines(t, `{"text": "hi"}`)
	a, err := agent.New(agent.Config{Models: []model.Endpoint{endpoint(p, "m")}})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	a.Run(t.Context(), agent.Input{Text: "hi"}, rec)
	bs := rec.ofType(event.TypeTurnStarted)[0].Data.(*event.TurnStarted).Budgets
	got := map[string]string{}
	for k, v := range bs {
		got[k] = v.Value
	}
	want := map[string]string{
		budget.KeyTool: "60s", budget.KeyToolMax: "1h", budget.KeyLLMFirstChunk: "60s", budget.KeyLLMIdle: "2m",
		budget.KeyLLMBudget: "off", budget.KeyStep: "5m", budget.KeyTurn: "30m", budget.KeyProgressNotice: "30s",
		budget.KeyKillGrace: "2s", budget.KeyCompaction: "60s", budget.KeyApproval: "24h", budget.KeyMaxSteps: "25", budget.KeyMaxToolCalls: "50",
		budget.KeyParallelTools: "4", budget.KeyMaxToolOutput: "1MiB", budget.KeyIdleBreaker: "3", budget.KeyMaxReply: "1MiB",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("turn_started budgets (-want +got):\n%s", diff)
	}
}
