package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/tool"
)

// drive runs a turn one unit at a time, as an engine that runs each unit
// in another process does: the state goes through JSON between units, and
// each unit builds its turn afresh. The tool calls of a step run one after
// the other.
func drive(t *testing.T, a *agent.Agent, in agent.Input) *agent.Result {
	t.Helper()
	hop := func(s *agent.State) *agent.State {
		b, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var out agent.State
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatal(err)
		}
		return &out
	}
	s := hop(a.Begin(in))
	for {
		calls, res := a.Think(context.Background(), s)
		if res != nil {
			return res
		}
		s = hop(s)
		step, results := s.Steps, make([]string, len(calls))
		refused := 0
		for i, c := range calls {
			id := fmt.Sprintf("call_%d_%d", step, i+1)
			var out agent.Called
			if int64(s.ToolCalls) >= s.Limits.MaxToolCalls.N {
				refused++
				out = a.Refuse(s, step, id, c, agent.RefusedLimit)
			} else {
				s.ToolCalls++
				out = a.Call(context.Background(), s, step, id, c)
			}
			results[i] = out.Result
			s.ToolRecords = append(s.ToolRecords, out.Record)
		}
		s.Heard(calls, results)
		s = hop(s)
		if refused > 0 {
			return a.End(s, budget.MaxToolCalls, nil, refused)
		}
	}
}

// TestUnitsAreRun checks that a turn driven one unit at a time, its state
// sent as JSON between units, ends as Run ends it: the same record (but
// for times and the events, which each unit numbers on its own), the same
// messages — for an answer after tool calls, and for max_tool_calls.
func TestUnitsAreRun(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits budget.Limits
	}{
		{name: "answer"},
		{name: "max_tool_calls", limits: budget.Limits{MaxToolCalls: budget.Count{N: 1, Source: budget.SourceCode}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			build := func() *agent.Agent {
				p := lines(t, `{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}, {"name": "echo", "arguments": {"x": 2}}]}`,
					`{"tool_calls": [{"name": "nope"}]}`, `{"text": "done"}`)
				a, err := agent.New(agent.Config{Name: "units", Models: []model.Endpoint{endpoint(p, "m")}, Limits: tc.limits,
					Tools: []agent.Tool{goTool("echo", budget.Cooperative, time.Second, func(_ context.Context, in json.RawMessage, _ tool.Progress) (any, error) {
						return in, nil
					})}})
				if err != nil {
					t.Fatal(err)
				}
				return a
			}
			in := agent.Input{TurnID: "t1", SessionID: "s1", Text: "go"}
			want := build().Run(context.Background(), in)
			got := drive(t, build(), in)
			opts := cmp.Options{
				cmpopts.IgnoreFields(event.Turn{}, "StartedAt", "EndedAt", "WallMS", "LLMMS", "ToolMS", "Events"),
				cmpopts.IgnoreFields(event.ToolCall{}, "StartedAt", "EndedAt", "DurationMS"),
				cmpopts.IgnoreFields(event.ModelCall{}, "StartedAt", "FirstChunkMS", "StreamMS"),
				// Records are in the order the calls started; calls of one
				// batch start together.
				cmpopts.SortSlices(func(a, b event.ToolCall) bool { return a.CallID < b.CallID }),
				// JSON sent as JSON comes back compact, as it is stored.
				cmp.Transformer("compact", func(r json.RawMessage) string {
					var b bytes.Buffer
					if json.Compact(&b, r) != nil {
						return string(r)
					}
					return b.String()
				}),
			}
			if diff := cmp.Diff(want.Record, got.Record, opts); diff != "" {
				t.Errorf("record (-Run +units):\n%s", diff)
			}
			if diff := cmp.Diff(want.Messages, got.Messages); diff != "" {
				t.Errorf("messages (-Run +units):\n%s", diff)
			}
		})
	}
}
