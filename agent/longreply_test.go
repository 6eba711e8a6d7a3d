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
	a := longReplyAgent(b, n)
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

// longReplyAgent is an agent whose model (OpenAI's wire format from
// internal/fakellm) replies n chunks of 1 KiB, under a max_reply of 16 MiB.
func longReplyAgent(tb testing.TB, n int) *agent.Agent {
	tb.Helper()
	chunks := make([]fakellm.Chunk, n)
	c := strings.Repeat("all work and no play makes jack a dull boy ", 30)[:1024]
	for i := range chunks {
		chunks[i] = fakellm.Chunk{Text: c}
	}
	srv := fakellm.New(fakellm.OpenAI, fakellm.Reply{Chunks: chunks})
	tb.Cleanup(srv.Close)
	p := openai.New(openai.Options{BaseURL: srv.BaseURL(), APIKey: "k"})
	lim := budget.DefaultLimits()
	lim.MaxReply.N = 16 << 20
	a, err := agent.New(agent.Config{Models: []model.Endpoint{{Provider: p, ProviderName: "openai", Model: "m"}}, Limits: lim})
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

// TestALongReplyIsJoinedBetweenCollections: a reply of 4 MiB or more is
// collected every 2 MiB as it streams from 4 MiB on, and joined between
// two garbage collections, so that the heap follows the reply rather than
// its peak (docs/decisions/long-texts.md); a short one forces none.
func TestALongReplyIsJoinedBetweenCollections(t *testing.T) {
	for _, tc := range []struct {
		chunks int
		forced uint32
	}{{4 << 10, 3}, {7 << 10, 4}, {64, 0}} {
		a := longReplyAgent(t, tc.chunks)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		res := a.Run(context.Background(), agent.Input{Text: "hi"}, event.SinkFunc(func(event.Event) {}))
		runtime.ReadMemStats(&after)
		if len(res.Record.Answer) != tc.chunks*1024 {
			t.Fatalf("answer %d bytes, stopped %s", len(res.Record.Answer), res.Record.StopReason)
		}
		if got := after.NumForcedGC - before.NumForcedGC; got != tc.forced {
			t.Errorf("a reply of %d KiB: %d collections forced, want %d", tc.chunks, got, tc.forced)
		}
	}
}
