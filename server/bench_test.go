package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/tool"
)

// BenchmarkStreamingTurns runs N turns at once through the HTTP server on
// loopback, each streamed to its own SSE client, and reports how long an
// event takes from its emission (its "at") to the client's read, and the
// memory a turn costs. One iteration is one batch of N turns; run a
// bounded number of them:
//
//	go test -run '^$' -bench StreamingTurns -benchtime 3x ./server/
//
// Each turn streams a 20-chunk reply, runs a Go tool that reports progress
// 20 times, then streams a 20-chunk answer: 70 events over about 0.3s.
func BenchmarkStreamingTurns(b *testing.B) {
	for _, st := range []string{"sqlite", "memory"} {
		for _, n := range []int{16, 128} {
			b.Run(fmt.Sprintf("store=%s/turns=%d", st, n), func(b *testing.B) { benchTurns(b, st, n) })
		}
	}
}

func benchTurns(b *testing.B, storeKind string, n int) {
	chunks := make([]string, 20)
	for i := range chunks {
		chunks[i] = fmt.Sprintf("word%d ", i)
	}
	cj, _ := json.Marshal(chunks)
	p := scripted(b,
		fmt.Sprintf(`{"chunks": %s, "chunk_delay": "5ms", "tool_calls": [{"name": "work"}]}`, cj),
		fmt.Sprintf(`{"chunks": %s, "chunk_delay": "5ms"}`, cj))
	work := goTool("work", budget.Cooperative, time.Minute, func(ctx context.Context, _ json.RawMessage, pr tool.Progress) (any, error) {
		for i := range 20 {
			v, total := float64(i+1), 20.0
			pr.Report(tool.Report{Progress: &v, Total: &total})
			time.Sleep(5 * time.Millisecond)
		}
		return "done", nil
	})
	var st store.Store
	if storeKind == "memory" {
		st = store.NewMemory()
	} else {
		st = openStore(b)
	}
	e := newEnv(b, server.Config{Agent: newAgent(b, p, work), Store: st})
	e.client.Transport.(*http.Transport).MaxIdleConnsPerHost = n

	var (
		mu        sync.Mutex
		latencies []time.Duration
		events    atomic.Int64
		peak      atomic.Uint64
	)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	b.ResetTimer()
	start := time.Now()
	for i := 0; b.Loop(); i++ {
		stopSampling := sampleHeap(&peak)
		var wg sync.WaitGroup
		for t := range n {
			wg.Go(func() {
				lat, err := streamOne(e, fmt.Sprintf("bench-%d-%d", i, t))
				if err != nil {
					b.Error(err)
					return
				}
				events.Add(int64(len(lat)))
				mu.Lock()
				latencies = append(latencies, lat...)
				mu.Unlock()
			})
		}
		wg.Wait()
		stopSampling()
	}
	elapsed := time.Since(start)
	b.StopTimer()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)

	slices.Sort(latencies)
	q := func(f float64) float64 {
		return float64(latencies[min(len(latencies)-1, int(f*float64(len(latencies))))].Microseconds()) / 1000
	}
	turns := float64(b.N * n)
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
	b.ReportMetric(float64(events.Load())/elapsed.Seconds(), "events/s")
	b.ReportMetric(float64(after.TotalAlloc-before.TotalAlloc)/turns/1024, "alloc-KiB/turn")
	b.ReportMetric(float64(peak.Load()-min(peak.Load(), before.HeapInuse))/float64(n)/1024, "heap-KiB/turn")
	b.ReportMetric(0, "ns/op") // a batch's wall time says nothing here
}

// streamOne runs one turn with an event stream and returns each event's
// delivery latency.
func streamOne(e *env, session string) ([]time.Duration, error) {
	resp, err := e.doCtx(context.Background(), "POST", "/v1/turns", map[string]any{"input": "go", "session_id": session},
		"Accept", sseAccept)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sse := newSSE(resp.Body)
	var out []time.Duration
	for {
		ev, err := sse.next()
		now := time.Now()
		if err != nil {
			if errors.Is(err, io.EOF) && len(out) > 0 {
				return out, nil
			}
			return out, err
		}
		var h struct {
			At time.Time `json:"at"`
		}
		if err := json.Unmarshal([]byte(ev.data), &h); err != nil {
			return out, err
		}
		out = append(out, now.Sub(h.At))
		if ev.typ == "turn_finished" {
			if !strings.Contains(ev.data, `"stop_reason":"answered"`) {
				return out, fmt.Errorf("turn ended: %s", ev.data)
			}
		}
	}
}

// sampleHeap records the peak HeapInuse until the returned func is called.
func sampleHeap(peak *atomic.Uint64) func() {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		var m runtime.MemStats
		for {
			runtime.ReadMemStats(&m)
			for {
				p := peak.Load()
				if m.HeapInuse <= p || peak.CompareAndSwap(p, m.HeapInuse) {
					break
				}
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() { close(stop); <-done }
}
