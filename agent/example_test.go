package agent_test

import (
	"context"
	"encoding/json"
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
		// Source and Knob may be left out: they become "code" and
		// "tools[word_count].timeout", what messages and records name.
		Tools: []agent.Tool{{Tool: wc, Budget: budget.ToolBudget{Timeout: budget.Duration{D: 5 * time.Second}}}},
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

// Events live, while the turn runs: Run on a goroutine that closes the
// channel when it returns, the caller reading as they come. (An
// event.Channel read only after Run returns must hold every event of the
// turn, or the turn waits for room.)
func ExampleAgent_Run_liveEvents() {
	lines, _ := script.Parse(strings.NewReader(`{"tool_calls": [{"name": "fetch", "arguments": {}}]}
{"text": "Fetched."}`), "example")
	m, _ := script.New(lines)
	fetch := tool.NewFunc("fetch", "Fetches a page.", nil, func(ctx context.Context, _ json.RawMessage, p tool.Progress) (any, error) {
		p.Report(tool.Report{Progress: new(1.0), Total: new(1.0), Message: "fetched"})
		return "<html>…</html>", nil
	})
	a, err := agent.New(agent.Config{Models: []model.Endpoint{{Provider: m, ProviderName: "script", Model: "demo"}}, Tools: []agent.Tool{{Tool: fetch}}})
	if err != nil {
		panic(err)
	}
	events := make(event.Channel) // unbuffered is fine: it is read at once
	done := make(chan *agent.Result, 1)
	go func() {
		done <- a.Run(context.Background(), agent.Input{Text: "Fetch it."}, events)
		close(events) // nothing is emitted after Run returns
	}()
	for e := range events {
		switch d := e.Data.(type) {
		case *event.ToolStarted:
			fmt.Println(e.Type, d.Tool, d.Enforcement, d.TimeoutMS)
		case *event.ToolProgress:
			fmt.Println(e.Type, d.Message)
		case *event.TurnFinished:
			fmt.Println(e.Type, d.Status, d.StopReason)
		}
	}
	res := <-done
	fmt.Println(res.Record.Answer)
	// Output:
	// tool_started fetch cooperative 60000
	// tool_progress fetched
	// turn_finished completed answered
	// Fetched.
}

// A Go tool's own timeout, enforced: its context is cancelled at the
// deadline, the model is told the call timed out (not that it failed),
// and the turn goes on.
func ExampleAgent_Run_toolTimeout() {
	lines, _ := script.Parse(strings.NewReader(`{"tool_calls": [{"name": "slow", "arguments": {}}]}
{"text": "The tool timed out; here is what I know."}`), "example")
	m, _ := script.New(lines)
	slow := tool.NewFunc("slow", "Takes a minute.", nil, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
		select {
		case <-time.After(time.Minute):
			return "done", nil
		case <-ctx.Done(): // a Go tool must watch its context
			return nil, ctx.Err()
		}
	})
	a, err := agent.New(agent.Config{
		Models: []model.Endpoint{{Provider: m, ProviderName: "script", Model: "demo"}},
		Tools:  []agent.Tool{{Tool: slow, Budget: budget.ToolBudget{Timeout: budget.Duration{D: 50 * time.Millisecond}}}},
	})
	if err != nil {
		panic(err)
	}
	res := a.Run(context.Background(), agent.Input{Text: "Go."})
	c := res.Record.ToolCalls[0]
	var told struct {
		Error struct{ Type, Limit, Knob string }
	}
	_ = json.Unmarshal([]byte(c.Result), &told)
	fmt.Println(c.Tool, c.Outcome, c.Phase, c.TimeoutSource)
	fmt.Println(told.Error.Type, told.Error.Limit, told.Error.Knob)
	fmt.Println(res.Record.Status, res.Record.StopReason)
	// Output:
	// slow timed_out tool code
	// tool_timeout 50ms tools[slow].timeout
	// completed answered
}

// Cancelling the context while a tool runs stops the tool and ends the
// turn cancelled, with a message for the person waiting; the record keeps
// the call.
func ExampleAgent_Run_cancelMidTool() {
	lines, _ := script.Parse(strings.NewReader(`{"tool_calls": [{"name": "slow", "arguments": {}}]}`), "example")
	m, _ := script.New(lines)
	started := make(chan struct{})
	slow := tool.NewFunc("slow", "Takes a minute.", nil, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	})
	a, err := agent.New(agent.Config{Models: []model.Endpoint{{Provider: m, ProviderName: "script", Model: "demo"}}, Tools: []agent.Tool{{Tool: slow}}})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-started; cancel() }()
	res := a.Run(ctx, agent.Input{Text: "Go."})
	fmt.Println(res.Record.Status, res.Record.StopReason)
	fmt.Println(strings.Contains(res.Record.Message, "tool slow was stopped"))
	fmt.Println(res.Record.ToolCalls[0].Tool, res.Record.ToolCalls[0].Outcome)
	// Output:
	// cancelled cancelled
	// true
	// slow cancelled
}

// A library callback decides on the calls of a tool that needs approval;
// a denied call is not run, and the model is told so.
func ExampleApproverFunc() {
	lines, _ := script.Parse(strings.NewReader(`{"tool_calls": [{"name": "deploy", "arguments": {"env": "prod"}}]}
{"text": "Not deployed."}`), "example")
	m, _ := script.New(lines)
	deploy := tool.NewFunc("deploy", "Deploys.", nil, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
		return "deployed", nil
	})
	a, err := agent.New(agent.Config{
		Models: []model.Endpoint{{Provider: m, ProviderName: "script", Model: "demo"}},
		Tools:  []agent.Tool{{Tool: deploy, NeedsApproval: agent.ApprovalRequired}},
	})
	if err != nil {
		panic(err)
	}
	noProd := agent.ApproverFunc(func(ctx context.Context, req agent.ApprovalRequest) (agent.Decision, error) {
		if strings.Contains(string(req.Arguments), `"prod"`) {
			return agent.Decision{Decision: event.Deny, By: "policy", Reason: "no deploys to prod from here"}, nil
		}
		return agent.Decision{Decision: event.Approve, By: "policy"}, nil
	})
	res := a.Run(context.Background(), agent.Input{Text: "Deploy to prod.", Approver: noProd})
	c := res.Record.ToolCalls[0]
	fmt.Println(c.Tool, c.Outcome)
	fmt.Println(res.Record.Status, res.Record.StopReason, res.Record.Answer)
	// Output:
	// deploy denied
	// completed answered Not deployed.
}
