package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/tool"
)

// BenchmarkIdleFollowers: N followers (TB_BENCH_FOLLOWERS, 1,000) of one
// turn parked in a tool, over HTTP on loopback in this process (issue 29).
// Reported: the memory an idle follower costs, both ends of its
// connection counted (heap and stacks after GC, over N), and how long one
// event (a tool_progress) takes to reach every follower, p50, p99 and the
// last. BenchmarkIdleFollowersFloor is the least the same costs: as many
// plain streaming responses that write one line when told.
//
//	go test -run '^$' -bench IdleFollowers -benchtime 1x ./server/
func BenchmarkIdleFollowers(b *testing.B) {
	n := 1000
	if v := os.Getenv("TB_BENCH_FOLLOWERS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	tick, release := make(chan struct{}), make(chan struct{})
	parked := make(chan struct{}, 1)
	wait := goTool("wait", budget.Cooperative, time.Hour, func(ctx context.Context, _ json.RawMessage, p tool.Progress) (any, error) {
		parked <- struct{}{}
		v := 0.0
		for {
			select {
			case <-tick:
				v++
				p.Report(tool.Report{Progress: &v})
			case <-release:
				return "ok", nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	})
	p := scripted(b, `{"text": "waiting", "tool_calls": [{"name": "wait"}]}`, `{"text": "done"}`)
	e := newEnv(b, server.Config{Agent: newAgent(b, p, wait), Store: store.NewMemory()})
	e.client.Transport.(*http.Transport).MaxIdleConnsPerHost = n
	for b.Loop() {
		resp, err := e.doCtx(context.Background(), "POST", "/v1/turns", map[string]any{"input": "go", "detach": true})
		if err != nil {
			b.Fatal(err)
		}
		id := resp.Header.Get("Timebox-Turn-Id")
		resp.Body.Close()
		<-parked
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		var ready, got sync.WaitGroup
		ready.Add(n)
		got.Add(n)
		seen := make([]time.Time, n)
		ctx, cancel := context.WithCancel(context.Background())
		for i := range n {
			go func() {
				r, err := e.doCtx(ctx, "GET", "/v1/turns/"+id+"/events?after=0", nil)
				if err != nil {
					b.Error(err)
					ready.Done()
					got.Done()
					return
				}
				defer r.Body.Close()
				sc := bufio.NewScanner(r.Body)
				first := true
				for sc.Scan() {
					line := sc.Text()
					if first && strings.HasPrefix(line, "event: tool_started") {
						first = false
						ready.Done()
					}
					if line == "event: tool_progress" {
						seen[i] = time.Now()
						got.Done()
						break
					}
				}
				for sc.Scan() { // idle until the turn ends
				}
			}()
		}
		ready.Wait()
		runtime.GC()
		var during runtime.MemStats
		runtime.ReadMemStats(&during)
		start := time.Now()
		tick <- struct{}{}
		got.Wait()
		lat := make([]time.Duration, n)
		for i, t := range seen {
			lat[i] = t.Sub(start)
		}
		slices.Sort(lat)
		q := func(f float64) float64 { return float64(lat[int(f*float64(n-1))].Microseconds()) / 1000 }
		mem := func(m runtime.MemStats) float64 { return float64(m.HeapInuse + m.StackInuse) }
		b.ReportMetric((mem(during)-mem(before))/float64(n)/1024, "KiB/follower")
		b.ReportMetric(q(0.5), "fanout-p50-ms")
		b.ReportMetric(q(0.99), "fanout-p99-ms")
		b.ReportMetric(q(1), "fanout-max-ms")
		b.ReportMetric(0, "ns/op")
		release <- struct{}{} // the turn ends
		cancel()
	}
}

// BenchmarkIdleFollowersFloor: N streaming HTTP responses on loopback, each
// a handler that flushes its headers and one line, then writes one more
// when told: the floor of BenchmarkIdleFollowers.
func BenchmarkIdleFollowersFloor(b *testing.B) {
	n := 1000
	if v := os.Getenv("TB_BENCH_FOLLOWERS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	for b.Loop() {
		tick := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Write([]byte("event: tool_started\n\n"))
			w.(http.Flusher).Flush()
			select {
			case <-tick:
				w.Write([]byte("event: tool_progress\n\n"))
				w.(http.Flusher).Flush()
			case <-r.Context().Done():
				return
			}
			<-r.Context().Done()
		}))
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		var ready, got, done sync.WaitGroup
		ready.Add(n)
		got.Add(n)
		seen := make([]time.Time, n)
		ctx, cancel := context.WithCancel(context.Background())
		for i := range n {
			done.Add(1)
			go func() {
				defer done.Done()
				req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
				r, err := client.Do(req)
				if err != nil {
					b.Error(err)
					ready.Done()
					got.Done()
					return
				}
				defer r.Body.Close()
				sc := bufio.NewScanner(r.Body)
				first := true
				for sc.Scan() {
					line := sc.Text()
					if first && line == "event: tool_started" {
						first = false
						ready.Done()
					}
					if line == "event: tool_progress" {
						seen[i] = time.Now()
						got.Done()
						break
					}
				}
				for sc.Scan() {
				}
			}()
		}
		ready.Wait()
		runtime.GC()
		var during runtime.MemStats
		runtime.ReadMemStats(&during)
		start := time.Now()
		close(tick)
		got.Wait()
		lat := make([]time.Duration, n)
		for i, t := range seen {
			lat[i] = t.Sub(start)
		}
		slices.Sort(lat)
		q := func(f float64) float64 { return float64(lat[int(f*float64(n-1))].Microseconds()) / 1000 }
		mem := func(m runtime.MemStats) float64 { return float64(m.HeapInuse + m.StackInuse) }
		b.ReportMetric((mem(during)-mem(before))/float64(n)/1024, "KiB/follower")
		b.ReportMetric(q(0.5), "fanout-p50-ms")
		b.ReportMetric(q(0.99), "fanout-p99-ms")
		b.ReportMetric(q(1), "fanout-max-ms")
		b.ReportMetric(0, "ns/op")
		cancel()
		done.Wait()
		client.CloseIdleConnections()
		srv.Close()
	}
}
