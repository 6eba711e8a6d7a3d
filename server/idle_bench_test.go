package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/benchprof"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/tool"
)

// BenchmarkIdleFollowers: N followers (TB_BENCH_FOLLOWERS, 1,000) of one
// turn parked in a tool (issue 29). The followers are another process (a
// child running TestFollowersChild), so what is measured is the server's
// side alone: the memory an idle follower costs it (heap and stacks after
// GC, over N), and how long one event (a tool_progress) takes to reach
// every follower, p50, p99 and the last. BenchmarkIdleFollowersFloor is
// the same against plain net/http streaming responses that write one line
// when told.
//
//	TB_BENCH_FOLLOWERS=10000 go test -run '^$' -bench IdleFollowers -benchtime 1x ./server/
func BenchmarkIdleFollowers(b *testing.B) {
	n := benchFollowers()
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
	for b.Loop() {
		resp, err := e.doCtx(context.Background(), "POST", "/v1/turns", map[string]any{"input": "go", "detach": true})
		if err != nil {
			b.Fatal(err)
		}
		id := resp.Header.Get("Timebox-Turn-Id")
		resp.Body.Close()
		<-parked
		followers(b, strings.TrimPrefix(e.url, "http://"), "/v1/turns/"+id+"/events?after=0", n,
			func() { tick <- struct{}{} }, func() { release <- struct{}{} })
	}
}

// BenchmarkIdleFollowersFloor: N streaming net/http responses, each a
// handler that flushes its headers and one line, then writes one more when
// told: the floor of BenchmarkIdleFollowers with a goroutine a follower.
func BenchmarkIdleFollowersFloor(b *testing.B) {
	n := benchFollowers()
	for b.Loop() {
		tick, release := make(chan struct{}), make(chan struct{})
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
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}))
		followers(b, strings.TrimPrefix(srv.URL, "http://"), "/", n, func() { close(tick) }, func() { close(release) })
		srv.Close()
	}
}

func benchFollowers() int {
	n := 1000
	if v := os.Getenv("TB_BENCH_FOLLOWERS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	return n
}

// followers runs n followers of path on addr in a child process, measures
// this process once they all have had their first event, then calls tick
// and reports how long the next event took to reach them; release ends
// the streams.
func followers(b *testing.B, addr, path string, n int, tick, release func()) {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFollowersChild$")
	cmd.Env = append(os.Environ(), "TB_FOLLOWERS_ADDR="+addr, "TB_FOLLOWERS_PATH="+path, fmt.Sprint("TB_FOLLOWERS_N=", n))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer cmd.Wait()
	lines := bufio.NewScanner(out)
	expect := func(want string) {
		if !lines.Scan() || lines.Text() != want {
			cmd.Process.Kill()
			b.Fatalf("the followers' process said %q (%v), want %q", lines.Text(), lines.Err(), want)
		}
	}
	expect("ready")
	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	stopProfile := benchprof.Phase(b, "") // TB_BENCH_PROFILE=PREFIX: the fan-out alone
	start := time.Now()
	tick()
	lat := make([]time.Duration, 0, n)
	for range n {
		if !lines.Scan() {
			b.Fatalf("the followers' process ended early: %v", lines.Err())
		}
		ns, err := strconv.ParseInt(lines.Text(), 10, 64)
		if err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Unix(0, ns).Sub(start))
	}
	stopProfile()
	release()
	expect("done")
	slices.Sort(lat)
	q := func(f float64) float64 { return float64(lat[int(f*float64(n-1))].Microseconds()) / 1000 }
	mem := func(m runtime.MemStats) float64 { return float64(m.HeapInuse + m.StackInuse) }
	b.ReportMetric((mem(during)-mem(before))/float64(n)/1024, "KiB/follower")
	b.ReportMetric(q(0.5), "fanout-p50-ms")
	b.ReportMetric(q(0.99), "fanout-p99-ms")
	b.ReportMetric(q(1), "fanout-max-ms")
	b.ReportMetric(0, "ns/op")
}

// TestFollowersChild is the followers' process of followers (it does
// nothing in a test run): TB_FOLLOWERS_N connections to TB_FOLLOWERS_ADDR,
// each asking for TB_FOLLOWERS_PATH as an event stream. It prints "ready"
// once each has read its first event, then, as each reads its second, the
// time (Unix ns), and "done" once every stream has ended.
func TestFollowersChild(t *testing.T) {
	addr := os.Getenv("TB_FOLLOWERS_ADDR")
	if addr == "" {
		t.Skip("the followers' process of BenchmarkIdleFollowers")
	}
	n, _ := strconv.Atoi(os.Getenv("TB_FOLLOWERS_N"))
	req := "GET " + os.Getenv("TB_FOLLOWERS_PATH") + " HTTP/1.1\r\nHost: " + addr + "\r\nAccept: text/event-stream\r\nConnection: close\r\n\r\n"
	var ready, got, done sync.WaitGroup
	ready.Add(n)
	got.Add(n)
	seen := make([]int64, n)
	dialing := make(chan struct{}, 128) // SYNs in flight: the listen backlog is finite
	for i := range n {
		done.Add(1)
		dialing <- struct{}{}
		go func() {
			defer done.Done()
			c, err := net.Dial("tcp", addr)
			<-dialing
			if err != nil {
				t.Error(err)
				ready.Done()
				got.Done()
				return
			}
			defer c.Close()
			c.Write([]byte(req))
			r := bufio.NewReaderSize(c, 512)
			first := true
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					t.Errorf("follower %d: %v", i, err)
					if first {
						ready.Done()
					}
					got.Done()
					return
				}
				if first && strings.HasPrefix(line, "event: tool_started") {
					first = false
					ready.Done()
				}
				if strings.HasPrefix(line, "event: tool_progress") {
					seen[i] = time.Now().UnixNano()
					got.Done()
					break
				}
			}
			c.SetReadDeadline(time.Now().Add(time.Minute))
			for {
				if _, err := r.ReadString('\n'); err != nil {
					return // the stream ended
				}
			}
		}()
	}
	ready.Wait()
	fmt.Println("ready")
	got.Wait()
	w := bufio.NewWriter(os.Stdout)
	for _, ns := range seen {
		fmt.Fprintln(w, ns)
	}
	w.Flush()
	done.Wait()
	fmt.Println("done")
}
