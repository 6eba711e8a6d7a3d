package mcptool_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/tool"
	"github.com/timebox-run/timebox/tool/mcptool"
)

// Start a stdio server, list its tools with their budgets, and run one call
// under its budget as a turn would.
func ExampleOpen() {
	ctx := context.Background()
	s, err := mcptool.Open(ctx, mcptool.Config{
		Name:    "everything",
		Command: []string{"npx", "-y", "@modelcontextprotocol/server-everything", "stdio"},
		Budget: budget.ToolBudget{
			Timeout:     budget.Duration{D: time.Minute, Source: budget.SourceTool, Knob: "tools[everything].timeout"},
			Enforcement: budget.Hard,
			KillGrace:   budget.Duration{D: 2 * time.Second},
		},
		Overrides: map[string]mcptool.Override{
			"trigger-long-running-operation": {
				Timeout:     budget.Duration{D: 30 * time.Second, Source: budget.SourceTool},
				IdleTimeout: budget.Duration{D: 5 * time.Second, Source: budget.SourceTool},
			},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	defer s.Close() // the server's whole process tree is gone when Close returns

	for _, t := range s.Tools() {
		fmt.Println(t.Spec().Name, t.Budget().Timeout, t.Budget().IdleTimeout)
	}
	long := s.Tools()[0]
	for _, t := range s.Tools() {
		if t.RemoteName() == "trigger-long-running-operation" {
			long = t
		}
	}
	c := &tool.Call{ID: "call_1", Tool: long.Spec().Name, Input: json.RawMessage(`{"duration": 3, "steps": 6}`)}
	x := tool.Run(ctx, long, c, long.Budget(), tool.Hooks{
		OnProgress: func(r tool.Report) { fmt.Println("progress", *r.Progress, "of", *r.Total) },
	})
	fmt.Println(x.Outcome, tool.ModelResult(long.Spec().Name, long.Budget(), x))
}
