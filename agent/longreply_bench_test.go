package agent_test

import (
	"context"
	"runtime"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/fakellm"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/openai"
)

// BenchmarkLongReply: one turn whose reply is 15 MB of text in 1 KiB
// chunks (OpenAI's wire format from internal/fakellm), under a max_reply of
// 16 MiB. Reported: bytes allocated per byte of reply, and the live heap
// after the turn over the reply (what the turn keeps).
func BenchmarkLongReply(b *testing.B) {
	const n = 15 << 20 / 1024
	chunks := make([]fakellm.Chunk, n)
	c := strings.Repeat("all work and no play makes jack a dull boy ", 30)[:1024]
	for i := range chunks {
		chunks[i] = fakellm.Chunk{Text: c}
	}
	srv := fakellm.New(fakellm.OpenAI, fakellm.Reply{Chunks: chunks})
	defer srv.Close()
	p := openai.New(openai.Options{BaseURL: srv.BaseURL(), APIKey: "k"})
	lim := budget.DefaultLimits()
	lim.MaxReply.N = 16 << 20
	a, err := agent.New(agent.Config{Models: []model.Endpoint{{Provider: p, ProviderName: "openai", Model: "m"}}, Limits: lim})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		res := a.Run(context.Background(), agent.Input{Text: "hi"}, event.SinkFunc(func(event.Event) {}))
		if len(res.Record.Answer) != n*1024 {
			b.Fatalf("answer %d bytes, stopped %s", len(res.Record.Answer), res.Record.StopReason)
		}
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		b.ReportMetric(float64(m.HeapAlloc)/float64(n*1024), "live-heap/reply")
		runtime.KeepAlive(res)
	}
}
