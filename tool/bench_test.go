package tool_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/tool"
)

// BenchmarkGoFuncCall measures what running a Go-function tool under its
// budget costs over calling the function: the deadline timer, the call's
// goroutine, cancellation plumbing and the result. Target: ≤ 20µs a call.
func BenchmarkGoFuncCall(b *testing.B) {
	f := tool.NewFunc("echo", "", nil, func(_ context.Context, in json.RawMessage, _ tool.Progress) (any, error) {
		return in, nil
	})
	bud := budget.ToolBudget{Timeout: budget.Duration{D: time.Minute}, IdleTimeout: budget.Duration{D: time.Minute},
		Enforcement: budget.Cooperative, KillGrace: budget.Duration{D: time.Second}}
	in := json.RawMessage(`{"text": "hello"}`)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		x := tool.Run(ctx, f, &tool.Call{Tool: "echo", Input: in, MaxOutput: 1 << 20}, bud, tool.Hooks{})
		if x.Outcome != "ok" {
			b.Fatal(x.Outcome)
		}
	}
}

// BenchmarkGoFuncDirect is the baseline: the same function called directly.
func BenchmarkGoFuncDirect(b *testing.B) {
	f := tool.NewFunc("echo", "", nil, func(_ context.Context, in json.RawMessage, _ tool.Progress) (any, error) {
		return in, nil
	})
	in := json.RawMessage(`{"text": "hello"}`)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := f.Call(ctx, &tool.Call{Tool: "echo", Input: in}); err != nil {
			b.Fatal(err)
		}
	}
}
