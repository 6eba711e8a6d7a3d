package mcpserve_test

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/mcpserve"
	"github.com/timebox-run/timebox/tool"
)

// A tool that does not finish within its timeout answers an MCP client
// with a tool result: isError, and the tool_timeout the model would get.
// (`timebox mcp serve` serves an agent file's exec tools this way, over
// stdio, with the budgets timebox.Build resolved.)
func Example() {
	wait := tool.Typed("wait", "Waits until it is stopped.", func(ctx context.Context, _ struct{}, _ tool.Progress) (string, error) {
		<-ctx.Done()
		return "", context.Cause(ctx)
	})
	s, err := mcpserve.New([]agent.Tool{{Tool: wait, Budget: budget.ToolBudget{
		Timeout:     budget.Duration{D: 50 * time.Millisecond, Source: budget.SourceCode, Knob: "the wait tool's timeout"},
		KillGrace:   budget.Duration{D: time.Second, Source: budget.SourceCode},
		Enforcement: budget.Cooperative,
	}}}, mcpserve.Options{})
	if err != nil {
		panic(err)
	}
	st, ct := mcp.NewInMemoryTransports()
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, st) }()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "example", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		panic(err)
	}
	r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "wait", Arguments: map[string]any{}})
	if err != nil {
		panic(err)
	}
	var e struct {
		Error struct{ Type, Limit, Knob string } `json:"error"`
	}
	json.Unmarshal([]byte(r.Content[0].(*mcp.TextContent).Text), &e)
	fmt.Println(r.IsError, e.Error.Type, e.Error.Limit, e.Error.Knob)
	cs.Close()
	stop()
	<-served
	// Output: true tool_timeout 50ms the wait tool's timeout
}
