package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/tool"
)

// requestAgent has a tool that hangs until cancelled, with no timeout of
// its own, and lets a request raise timeouts.turn up to 2h.
func requestAgent(t *testing.T) *agent.Agent {
	t.Helper()
	hang := agent.Tool{Tool: tool.NewFunc("hang", "hangs", nil, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})}
	a, err := agent.New(agent.Config{Name: "test",
		Models:     []model.Endpoint{{Provider: scripted(t, `{"tool_calls": [{"name": "hang"}]}`, `{"text": "never"}`), ProviderName: "script", Model: "m"}},
		Tools:      []agent.Tool{hang},
		RequestMax: map[string]int64{"turn": int64(2 * time.Hour)}})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestRequestTurnBudget: a turn posted with "budgets": {"turn": "1500ms"}
// on a hung tool stops with turn_timeout at about 1.5s, and its message and
// turn_finished name the request as the source.
func TestRequestTurnBudget(t *testing.T) {
	e := newEnv(t, server.Config{Agent: requestAgent(t)})
	start := time.Now()
	resp := e.do("POST", "/v1/turns", map[string]any{"input": "go", "budgets": map[string]any{"turn": "1500ms"}})
	rec := decode[rawRecord](t, resp, http.StatusOK)
	if took := time.Since(start); took < 1500*time.Millisecond || took > 10*time.Second {
		t.Errorf("the turn took %s, want about 1.5s", took)
	}
	if rec.StopReason != budget.TurnTimeout || !strings.Contains(rec.Message, "timeouts.turn = 1.5s (from the request)") {
		t.Errorf("stopped %s: %q", rec.StopReason, rec.Message)
	}
	var limit *budget.BudgetValue
	for _, raw := range rec.Events {
		var tf struct {
			Type  string              `json:"type"`
			Limit *budget.BudgetValue `json:"limit"`
		}
		if err := json.Unmarshal(raw, &tf); err != nil {
			t.Fatal(err)
		}
		if tf.Type == "turn_finished" {
			limit = tf.Limit
		}
	}
	want := &budget.BudgetValue{Key: "timeouts.turn", Value: "1.5s", MS: 1500, Source: budget.SourceRequest, Knob: "budgets.turn in the request"}
	if diff := cmp.Diff(want, limit); diff != "" {
		t.Errorf("turn_finished limit (-want +got):\n%s", diff)
	}
}

// TestRequestBudgetRefused: a budget over its ceiling, one a request may
// not set, or a malformed one is a 400 that names the budget, the value
// asked for and the ceiling; no turn starts.
func TestRequestBudgetRefused(t *testing.T) {
	e := newEnv(t, server.Config{Agent: requestAgent(t)})
	type errBody struct {
		Error struct {
			Code    string `json:"code"`
			Key     string `json:"key"`
			Asked   string `json:"asked"`
			Ceiling string `json:"ceiling"`
			Message string `json:"message"`
		} `json:"error"`
	}
	for _, tc := range []struct {
		name    string
		budgets map[string]any
		key     string
		asked   string
		ceiling string
		says    string
	}{
		{"over the ceiling", map[string]any{"turn": "48h"}, "turn", "48h", "2h", "server.request_max.turn"},
		{"raise without a ceiling", map[string]any{"max_steps": 100}, "max_steps", "100", "25", "limits.max_steps"},
		{"not settable", map[string]any{"kill_grace": "1s"}, "kill_grace", "1s", "", "it may set tool, llm_budget, step, turn, max_steps, max_tool_calls"},
		{"malformed", map[string]any{"turn": "soon"}, "turn", "soon", "", "not a duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := e.do("POST", "/v1/turns", map[string]any{"input": "go", "budgets": tc.budgets})
			got := decode[errBody](t, resp, http.StatusBadRequest).Error
			if got.Code != "bad_budget" || got.Key != tc.key || got.Asked != tc.asked || got.Ceiling != tc.ceiling ||
				!strings.Contains(got.Message, tc.says) || !strings.Contains(got.Message, "budgets."+tc.key) {
				t.Errorf("got %+v, want key %s, asked %s, ceiling %q, a message with %q", got, tc.key, tc.asked, tc.ceiling, tc.says)
			}
		})
	}
	list := decode[struct {
		Turns []json.RawMessage `json:"turns"`
	}](t, e.do("GET", "/v1/turns", nil), http.StatusOK)
	if len(list.Turns) != 0 {
		t.Errorf("%d turns stored after refused requests", len(list.Turns))
	}
}
