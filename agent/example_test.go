package agent_test

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/script"
	"github.com/timebox-run/timebox/tool"
)

// An agent built from code: a scripted model, one Go-function tool with its
// own budget, events on a channel.
func ExampleAgent_Run() {
	lines, _ := script.Parse(strings.NewReader(`{"tool_calls": [{"name": "word_count", "arguments": {"text": "honest budgets for every call"}}]}
{"text": "That is 5 words."}`), "example")
	model0, _ := script.New(lines)

	type input struct {
		Text string `json:"text"`
	}
	wc := tool.Typed("word_count", "Counts the words of a text.", func(ctx context.Context, in input, p tool.Progress) (int, error) {
		return len(strings.Fields(in.Text)), nil
	})
	a, err := agent.New(agent.Config{
		Instructions: "Count words.",
		Models:       []model.Endpoint{{Provider: model0, ProviderName: "script", Model: "demo"}},
		Tools: []agent.Tool{{Tool: wc, Budget: budget.ToolBudget{
			Timeout: budget.Duration{D: 5 * time.Second, Source: budget.SourceCode, Knob: "word_count timeout"}}}},
	})
	if err != nil {
		panic(err)
	}
	events := make(event.Channel, 64)
	res := a.Run(context.Background(), agent.Input{Text: "How many words?"}, events)
	close(events)
	for e := range events {
		if f, ok := e.Data.(*event.ToolFinished); ok {
			fmt.Println(f.Tool, f.Outcome, f.Result)
		}
	}
	fmt.Println(res.Record.Status, res.Record.StopReason)
	fmt.Println(res.Record.Answer)
	// Output:
	// word_count ok 5
	// completed answered
	// That is 5 words.
}

// Cancelling the context cancels the turn; the cause says why.
func ExampleAgent_Run_cancel() {
	lines, _ := script.Parse(strings.NewReader(`{"text": "slow", "first_chunk_delay": "1m"}`), "example")
	m, _ := script.New(lines)
	a, _ := agent.New(agent.Config{Models: []model.Endpoint{{Provider: m, ProviderName: "script", Model: "demo"}}})
	ctx, cancel := context.WithCancelCause(context.Background())
	time.AfterFunc(50*time.Millisecond, func() { cancel(&budget.CancelError{Reason: budget.ClientGone}) })
	res := a.Run(ctx, agent.Input{Text: "hi"})
	fmt.Println(res.Record.Status, res.Record.StopReason)
	// Output:
	// cancelled client_gone
}
