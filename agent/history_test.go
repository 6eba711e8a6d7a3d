package agent_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
)

// shape writes a conversation compactly: u (user), a (assistant without
// calls), a[c1 c2] (assistant calling c1 and c2), r:c1 (result of c1),
// x:c1 (the tool_cancelled result made for c1).
func shape(h []model.Message) string {
	var parts []string
	for _, m := range h {
		switch m.Role {
		case model.RoleUser:
			parts = append(parts, "u")
		case model.RoleAssistant:
			if len(m.ToolCalls) == 0 {
				parts = append(parts, "a")
				continue
			}
			var ids []string
			for _, c := range m.ToolCalls {
				ids = append(ids, c.ID)
			}
			parts = append(parts, "a["+strings.Join(ids, " ")+"]")
		case model.RoleTool:
			if strings.Contains(m.Content, `"tool_cancelled"`) {
				parts = append(parts, "x:"+m.ToolCallID)
			} else {
				parts = append(parts, "r:"+m.ToolCallID)
			}
		}
	}
	return strings.Join(parts, " ")
}

// build is shape's inverse.
func build(s string) []model.Message {
	var h []model.Message
	for _, p := range strings.Fields(strings.NewReplacer("[", " [", "]", "").Replace(s)) {
		switch {
		case p == "u":
			h = append(h, model.Message{Role: model.RoleUser, Content: "hi"})
		case p == "a":
			h = append(h, model.Message{Role: model.RoleAssistant, Content: "ok"})
		case strings.HasPrefix(p, "["):
			h[len(h)-1].Content = ""
			for _, id := range strings.Split(strings.TrimPrefix(p, "["), ",") {
				h[len(h)-1].ToolCalls = append(h[len(h)-1].ToolCalls, model.ToolCall{ID: id, Name: "crawl", Arguments: "{}"})
			}
		case strings.HasPrefix(p, "r:"):
			h = append(h, model.Message{Role: model.RoleTool, ToolCallID: p[2:], ToolName: "crawl", Content: "result of " + p[2:]})
		}
	}
	return h
}

// Whatever a cut can leave, every call ends up with exactly one result
// right after it.
func TestRepairHistory(t *testing.T) {
	cases := []struct {
		in, want string
		repaired int
	}{
		{"u a[c1,c2] r:c1 r:c2 a u a", "u a[c1 c2] r:c1 r:c2 a u a", 0},
		{"u a[c1,c2] r:c2 r:c1 a", "u a[c1 c2] r:c2 r:c1 a", 0}, // another order is not a fault
		{"u a[c1]", "u a[c1] x:c1", 1},                          // cut after the model asked
		{"u a[c1,c2] r:c1", "u a[c1 c2] r:c1 x:c2", 1},          // cut between two results
		{"u a[c1,c2] r:c2", "u a[c1 c2] x:c1 r:c2", 1},
		{"u a[c1] u a", "u a[c1] x:c1 u a", 1},      // the next turn came after the cut
		{"r:c1 u a", "u a", 1},                      // a result whose call is gone
		{"u a[c1] u r:c1 a", "u a[c1] x:c1 u a", 2}, // a result that lost its place
		{"u a r:c1", "u a", 1},                      // after an answer, not a call
		{"u a[c1] r:c1 r:c1", "u a[c1] r:c1", 1},    // written twice
		{"u a[c1] r:c9 r:c1", "u a[c1] r:c1", 1},    // answers no call of its message
		{"u a[c1,c2] r:c2 r:c2", "u a[c1 c2] x:c1 r:c2", 2},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			in := build(tc.in)
			before, _ := json.Marshal(in)
			out, n := agent.RepairHistory(in)
			if got := shape(out); got != tc.want || n != tc.repaired {
				t.Fatalf("got %q (%d repaired), want %q (%d)", got, n, tc.want, tc.repaired)
			}
			if after, _ := json.Marshal(in); string(after) != string(before) {
				t.Fatal("the caller's history was modified")
			}
			if n == 0 && len(in) > 0 && &out[0] != &in[0] {
				t.Fatal("an intact history was copied")
			}
			for _, m := range out {
				if m.Role == model.RoleTool && strings.Contains(m.Content, "tool_cancelled") {
					info := errorInfo(t, m.Content)
					if info.Tool != "crawl" || m.ToolName != "crawl" || !strings.Contains(info.Message, "the turn that called it was interrupted") {
						t.Fatalf("made result %+v", m)
					}
				}
			}
		})
	}
}

// A session whose stored history was cut by a crash — a tool call with no
// result, and a stray result — goes on through both providers over their
// real wire formats: the fakes refuse the broken pairing as the APIs do, so
// without the repair the turn would fail with model_rejected.
func TestInterruptedHistoryThroughBothProviders(t *testing.T) {
	// A result whose call is gone (r:c0), a call without its result (c3),
	// a result stored twice (c2).
	history := build("r:c0 u a[c1] r:c1 a u a[c2,c3] r:c2 r:c2")
	for _, label := range []string{"A1", "B"} {
		t.Run(label, func(t *testing.T) {
			c := newChaos(t, replies{answer("picked up again")}, replies{answer("picked up again")})
			c.history = history
			var ep []model.Endpoint
			for _, e := range c.endpoints() {
				if e.Profile == label {
					ep = append(ep, e)
				}
			}
			o := c.run(ep...)
			r := o.res.Record
			if r.StopReason != budget.Answered || r.Answer != "picked up again" || !slices.Equal(o.hits, []string{label}) {
				t.Fatalf("got %s, hits %v: %s", r.StopReason, o.hits, r.Message)
			}
			sent, _ := json.Marshal(c.requests()[label][0].Body["messages"])
			if strings.Count(string(sent), "tool_cancelled") != 1 || strings.Count(string(sent), "result of c2") != 1 ||
				strings.Contains(string(sent), "c0") {
				t.Fatalf("sent %s", sent)
			}
			ts := o.rec.ofType(event.TypeTurnStarted)[0].Data.(*event.TurnStarted)
			if ts.HistoryRepaired != 3 {
				t.Fatalf("turn_started says %d repaired", ts.HistoryRepaired)
			}
		})
	}
}

func ExampleRepairHistory() {
	history := []model.Message{
		{Role: model.RoleUser, Content: "crawl it"},
		{Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "c1", Name: "crawl", Arguments: "{}"}}},
		// the process crashed here: no result for c1
	}
	h, n := agent.RepairHistory(history)
	fmt.Println(n, h[2].Role, h[2].ToolCallID)
	// Output: 1 tool c1
}
