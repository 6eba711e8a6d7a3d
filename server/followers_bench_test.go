package server_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/fakellm"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/openai"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
)

// BenchmarkLongReplyFollowers: one turn whose reply is 15 MiB of text in
// 1 KiB chunks (issue 29), posted by a client that reads its stream, with
// F more followers of the turn that connect and never read. Reported: the
// peak heap over the reply.
//
//	go test -run '^$' -bench LongReplyFollowers -benchtime 1x ./server/
func BenchmarkLongReplyFollowers(b *testing.B) {
	const size = 15 << 20
	chunks := make([]fakellm.Chunk, size/1024)
	c := strings.Repeat("all work and no play makes jack a dull boy ", 30)[:1024]
	for i := range chunks {
		chunks[i] = fakellm.Chunk{Text: c}
	}
	srv := fakellm.New(fakellm.OpenAI, fakellm.Reply{Chunks: chunks})
	defer srv.Close()
	lim := budget.DefaultLimits()
	lim.MaxReply.N = 16 << 20
	a, err := agent.New(agent.Config{Name: "test", Limits: lim,
		Models: []model.Endpoint{{Provider: openai.New(openai.Options{BaseURL: srv.BaseURL(), APIKey: "k"}), ProviderName: "openai", Model: "m"}}})
	if err != nil {
		b.Fatal(err)
	}
	for _, f := range []int{0, 20} {
		b.Run(fmt.Sprintf("followers=%d", f), func(b *testing.B) {
			e := newEnv(b, server.Config{Agent: a, Store: store.NewMemory()})
			e.client.Transport.(*http.Transport).MaxIdleConnsPerHost = f + 1
			for b.Loop() {
				runtime.GC()
				var before runtime.MemStats
				runtime.ReadMemStats(&before)
				var peak atomic.Uint64
				stop := sampleHeap(&peak)
				resp, err := e.doCtx(context.Background(), "POST", "/v1/turns", map[string]any{"input": "write"})
				if err != nil {
					b.Fatal(err)
				}
				id := resp.Header.Get("Timebox-Turn-Id")
				var idle []*http.Response
				for range f {
					r, err := e.doCtx(context.Background(), "GET", "/v1/turns/"+id+"/events?after=0", nil)
					if err != nil {
						b.Fatal(err)
					}
					idle = append(idle, r) // never read
				}
				n, _ := io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				stop()
				for _, r := range idle {
					r.Body.Close()
				}
				if n < size {
					b.Fatalf("the stream carried %d bytes", n)
				}
				b.ReportMetric(float64(peak.Load()-min(peak.Load(), before.HeapInuse))/size, "peak-heap/reply")
				b.ReportMetric(0, "ns/op")
			}
		})
	}
}
