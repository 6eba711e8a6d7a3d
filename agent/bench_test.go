package agent_test

import (
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/script"
	"github.com/timebox-run/timebox/tool"
)

// BenchmarkTurnMemory measures the memory a running turn holds: N turns are
// started concurrently and parked inside a tool call (the common state of a
// long turn: model replied, tool running under its budget, watchdogs armed),
// and the live heap is divided by N. Reported as bytes/turn.
func BenchmarkTurnMemory(b *testing.B) {
	const n = 1000
	ls, _ := script.Parse(strings.NewReader(`{"chunks": ["Let me ", "check."], "tool_calls": [{"name": "wait", "arguments": {"q": "x"}}]}
{"text": "done"}`), "bench")
	p, _ := script.New(ls)
	for b.Loop() {
		release := make(chan struct{})
		var parked sync.WaitGroup
		parked.Add(n)
		wait := tool.NewFunc("wait", "waits", nil, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
			parked.Done()
			<-release
			return "ok", nil
		})
		a, err := agent.New(agent.Config{Models: []model.Endpoint{{Provider: p, ProviderName: "script", Model: "m"}},
			Tools: []agent.Tool{{Tool: wait, Budget: budget.ToolBudget{Timeout: budget.Duration{D: time.Hour}}}}})
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		var done sync.WaitGroup
		for i := range n {
			done.Add(1)
			go func() {
				defer done.Done()
				a.Run(context.Background(), agent.Input{SessionID: string(rune('a'+i%26)) + string(rune(i)), Text: "hi"})
			}()
		}
		parked.Wait()
		runtime.GC()
		var during runtime.MemStats
		runtime.ReadMemStats(&during)
		goroutines := runtime.NumGoroutine()
		close(release)
		done.Wait()
		b.ReportMetric(float64(during.HeapAlloc-before.HeapAlloc)/n, "heap-bytes/turn")
		b.ReportMetric(float64(goroutines)/n, "goroutines/turn")
	}
}
