package agent_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/fakellm"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/anthropic"
	"github.com/timebox-run/timebox/model/openai"
	"github.com/timebox-run/timebox/tool"
)

// notesTurn runs one turn against a fake provider of format whose model
// calls the tool "look" once, then answers, and returns the request
// bodies the provider received.
func notesTurn(t *testing.T, format fakellm.Format, notes bool, tools ...agent.Tool) []fakellm.Request {
	t.Helper()
	srv := fakellm.New(format, fakellm.ToolCall("call_1", "look", `{}`, 64), fakellm.Text("done", 0))
	t.Cleanup(srv.Close)
	var p model.Provider
	if format == fakellm.OpenAI {
		p = openai.New(openai.Options{BaseURL: srv.BaseURL(), APIKey: "sk-test"})
	} else {
		p = anthropic.New(anthropic.Options{BaseURL: srv.BaseURL(), APIKey: "sk-test"})
	}
	if len(tools) == 0 {
		tools = []agent.Tool{lookTool(budget.ToolBudget{
			Timeout:     budget.Duration{D: 10 * time.Second, Source: budget.SourceTool},
			IdleTimeout: budget.Duration{D: 2 * time.Second, Source: budget.SourceTool},
		})}
	}
	a, err := agent.New(agent.Config{Instructions: "Be brief.", TimeNotes: notes,
		Models: []model.Endpoint{{Provider: p, ProviderName: string(format), Model: "m"}}, Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	res := a.Run(t.Context(), agent.Input{Text: "look"})
	if res.Record.StopReason != budget.Answered {
		t.Fatalf("turn ended %s: %s", res.Record.StopReason, res.Record.Message)
	}
	return srv.Requests()
}

func lookTool(b budget.ToolBudget) agent.Tool {
	return agent.Tool{Tool: tool.NewFunc("look", "Looks around.", nil, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
		return "all quiet", nil
	}), Budget: b}
}

// toolDescription returns the description a request body gave the tool
// name, in either wire format.
func toolDescription(t *testing.T, body map[string]any, name string) string {
	t.Helper()
	tools, _ := body["tools"].([]any)
	for _, x := range tools {
		m, _ := x.(map[string]any)
		if f, ok := m["function"].(map[string]any); ok { // OpenAI
			m = f
		}
		if m["name"] == name {
			d, _ := m["description"].(string)
			return d
		}
	}
	t.Fatalf("no tool %s in %v", name, body["tools"])
	return ""
}

// TestToolsSayTheirBudget: with time notes on, the description each
// request gives a tool ends with its budget in plain words, on both wire
// formats; with them off, it is the description as written.
func TestToolsSayTheirBudget(t *testing.T) {
	for _, format := range []fakellm.Format{fakellm.OpenAI, fakellm.Anthropic} {
		t.Run(string(format), func(t *testing.T) {
			reqs := notesTurn(t, format, true)
			for i, r := range reqs {
				if got, want := toolDescription(t, r.Body, "look"), "Looks around. Times out after 10s; stopped if silent for 2s."; got != want {
					t.Errorf("request %d: description %q, want %q", i, got, want)
				}
			}
			reqs = notesTurn(t, format, false)
			if got := toolDescription(t, reqs[0].Body, "look"); got != "Looks around." {
				t.Errorf("notes off: description %q, want it as written", got)
			}
		})
	}
}

// TestToolBudgetWording: what each kind of budget says.
func TestToolBudgetWording(t *testing.T) {
	d := func(x time.Duration) budget.Duration { return budget.Duration{D: x, Source: budget.SourceTool} }
	for _, tc := range []struct {
		b    budget.ToolBudget
		want string
	}{
		{budget.ToolBudget{Timeout: d(10 * time.Second), Enforcement: budget.Hard}, "Looks around. Times out after 10s."},
		{budget.ToolBudget{Timeout: d(5 * time.Minute), Enforcement: budget.Cooperative}, "Looks around. Times out after 5m."},
		{budget.ToolBudget{Timeout: d(time.Second), Enforcement: budget.Advisory}, "Looks around. Advisory budget 1s: may run longer."},
		{budget.ToolBudget{Timeout: d(time.Second), IdleTimeout: d(500 * time.Millisecond), Enforcement: budget.Advisory},
			"Looks around. Advisory budget 1s, 500ms of silence: may run longer."},
	} {
		t.Run(tc.want, func(t *testing.T) {
			reqs := notesTurn(t, fakellm.OpenAI, true, lookTool(tc.b))
			if got := toolDescription(t, reqs[0].Body, "look"); got != tc.want {
				t.Errorf("description %q, want %q", got, tc.want)
			}
		})
	}
}

// TestResultsSayTheirTime: with time notes on, the result the model gets
// for a call ends with its time against its budget, on both wire formats;
// with them off, it is the tool's output alone.
func TestResultsSayTheirTime(t *testing.T) {
	for _, format := range []fakellm.Format{fakellm.OpenAI, fakellm.Anthropic} {
		t.Run(string(format), func(t *testing.T) {
			for _, notes := range []bool{true, false} {
				reqs := notesTurn(t, format, notes)
				if len(reqs) != 2 {
					t.Fatalf("%d requests, want 2", len(reqs))
				}
				b, _ := json.Marshal(reqs[1].Body["messages"])
				msgs := string(b)
				has := strings.Contains(msgs, `all quiet\n[timebox: took `) && strings.Contains(msgs, ` of 10s]`)
				if has != notes || !strings.Contains(msgs, "all quiet") {
					t.Errorf("notes %v: the result the model got: %s", notes, msgs)
				}
			}
		})
	}
}

// TestTurnSaysItsTime: with time notes on, each request ends with the
// turn's note (time left, the step window, tool calls left), after the
// whole conversation; the rest of a request is the previous one's byte
// for byte, which is what keeps the provider's prompt cache. With them
// off, there is no note.
func TestTurnSaysItsTime(t *testing.T) {
	for _, format := range []fakellm.Format{fakellm.OpenAI, fakellm.Anthropic} {
		t.Run(string(format), func(t *testing.T) {
			reqs := notesTurn(t, format, true)
			if len(reqs) != 2 {
				t.Fatalf("%d requests, want 2", len(reqs))
			}
			var rest [2][]any
			for i, r := range reqs {
				msgs, _ := r.Body["messages"].([]any)
				note, others := splitNote(t, format, msgs)
				calls := []string{"50 of 50", "49 of 50"}[i]
				if !strings.HasPrefix(note, "[timebox] Time left in this turn: ") || !strings.Contains(note, " of 30m. A step with no progress for 5m is stopped.") ||
					!strings.HasSuffix(note, " Tool calls left: "+calls+".") || strings.Contains(note, "Model time") {
					t.Errorf("request %d: note %q", i, note)
				}
				rest[i] = others
			}
			before, _ := json.Marshal(rest[0])
			after, _ := json.Marshal(rest[1][:len(rest[0])])
			if string(before) != string(after) {
				t.Errorf("the second request changed what the first sent:\n first %s\nsecond %s", before, after)
			}
			tools0, _ := json.Marshal(reqs[0].Body["tools"])
			tools1, _ := json.Marshal(reqs[1].Body["tools"])
			sys0, _ := json.Marshal(reqs[0].Body["system"])
			sys1, _ := json.Marshal(reqs[1].Body["system"])
			if string(tools0) != string(tools1) || string(sys0) != string(sys1) {
				t.Errorf("tools or system changed between requests")
			}

			for _, r := range notesTurn(t, format, false) {
				if b, _ := json.Marshal(r.Body); strings.Contains(string(b), "[timebox]") {
					t.Errorf("notes off: %s", b)
				}
			}
		})
	}
}

// splitNote returns the note a request's messages end with and the
// messages without it: OpenAI's last message, a system message; Anthropic's
// last block of the last user message.
func splitNote(t *testing.T, format fakellm.Format, msgs []any) (string, []any) {
	t.Helper()
	if len(msgs) == 0 {
		t.Fatal("no messages")
	}
	last, _ := msgs[len(msgs)-1].(map[string]any)
	if format == fakellm.OpenAI {
		if last["role"] != "system" {
			t.Fatalf("the last message is %v, want the system note", last)
		}
		note, _ := last["content"].(string)
		return note, msgs[:len(msgs)-1]
	}
	blocks, _ := last["content"].([]any)
	if last["role"] != "user" || len(blocks) == 0 {
		t.Fatalf("the last message is %v, want a user turn ending with the note", last)
	}
	b, _ := blocks[len(blocks)-1].(map[string]any)
	if b["type"] != "text" {
		t.Fatalf("the last block is %v, want the note", b)
	}
	note, _ := b["text"].(string)
	others := append([]any(nil), msgs[:len(msgs)-1]...)
	if len(blocks) > 1 {
		m := map[string]any{"role": "user", "content": blocks[:len(blocks)-1]}
		others = append(others, m)
	}
	return note, others
}

// TestScriptChecksTheNotes: the script model's expect_in_request sees the
// notes a turn sends, and stops the turn model_rejected when one is not
// there (notes off).
func TestScriptChecksTheNotes(t *testing.T) {
	for _, notes := range []bool{true, false} {
		p := lines(t,
			`{"tool_calls": [{"name": "look"}], "expect_in_request": ["Looks around. Times out after 10s.", "Tool calls left: 50 of 50."]}`,
			`{"text": "done", "expect_in_request": ["all quiet\n[timebox: took ", "Tool calls left: 49 of 50."]}`)
		a, err := agent.New(agent.Config{TimeNotes: notes, Models: []model.Endpoint{endpoint(p, "m")},
			Tools: []agent.Tool{lookTool(budget.ToolBudget{Timeout: budget.Duration{D: 10 * time.Second, Source: budget.SourceTool}})}})
		if err != nil {
			t.Fatal(err)
		}
		res := a.Run(t.Context(), agent.Input{Text: "look"})
		want := budget.Answered
		if !notes {
			want = budget.ModelRejected
		}
		if res.Record.StopReason != want {
			t.Errorf("notes %v: stopped %s (%s), want %s", notes, res.Record.StopReason, res.Record.Message, want)
		}
		if !notes && !strings.Contains(res.Record.Message, `expect_in_request: the request does not contain "Looks around. Times out after 10s."`) {
			t.Errorf("notes off: message %q", res.Record.Message)
		}
	}
}

// TestTurnNoteNamesTheModelBudget: the note says the model time left when
// timeouts.llm_budget is set, and the tool calls left of the turn's
// limits.max_tool_calls.
func TestTurnNoteNamesTheModelBudget(t *testing.T) {
	p := lines(t, `{"text": "done", "expect_in_request": ["Model time left: 30s of 30s. Tool calls left: 3 of 3."]}`)
	a, err := agent.New(agent.Config{TimeNotes: true, Models: []model.Endpoint{endpoint(p, "m")},
		Budgets: budget.Budgets{LLMBudget: budget.Duration{D: 30 * time.Second, Source: budget.SourceCode}},
		Limits:  budget.Limits{MaxToolCalls: budget.Count{N: 3, Source: budget.SourceCode}}})
	if err != nil {
		t.Fatal(err)
	}
	if res := a.Run(t.Context(), agent.Input{Text: "hi"}); res.Record.StopReason != budget.Answered {
		t.Fatalf("stopped %s: %s", res.Record.StopReason, res.Record.Message)
	}
}

// TestTheNoteAfterAFailover: the request of the attempt after a failed
// one says the time left now, not what was left before the failed
// attempt (it was sent the same note, 3s of turn and model time too many).
func TestTheNoteAfterAFailover(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		stalls := lines(t, `{"text": "x", "stall_after": 0}`)
		answers := lines(t, `{"text": "done", "expect_in_request": ["Time left in this turn: 17s of 20s.", "Model time left: 7s of 10s."]}`)
		b := budget.Budgets{Turn: secs(20*time.Second, budget.SourceCode, budget.KeyTurn),
			LLMFirstChunk: secs(3*time.Second, budget.SourceCode, budget.KeyLLMFirstChunk),
			LLMBudget:     secs(10*time.Second, budget.SourceCode, budget.KeyLLMBudget)}
		a, err := agent.New(agent.Config{TimeNotes: true, Models: []model.Endpoint{endpoint(stalls, "a"), endpoint(answers, "b")}, Budgets: b})
		if err != nil {
			t.Fatal(err)
		}
		if res := a.Run(t.Context(), agent.Input{Text: "hi"}); res.Record.StopReason != budget.Answered {
			t.Fatalf("stopped %s: %s", res.Record.StopReason, res.Record.Message)
		}
	})
}
