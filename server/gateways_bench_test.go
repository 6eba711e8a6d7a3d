package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/tool"
)

// BenchmarkGateways runs two servers on one PostgreSQL database (a
// throwaway cluster, testenv.Postgres; TB_TEST_PG_DURABLE=1 keeps fsync
// on) and N turns at once, started round-robin on the two. Each turn is
// streamed to the client that started it (same gateway) and followed by a
// second client through the other gateway (cross gateway). It reports the
// delivery latency — an event's emission ("at") to a client's read — of
// both, turns/s, and the database's growth per turn:
//
//	TB_TEST_PG_DURABLE=1 go test -run '^$' -bench Gateways -benchtime 3x ./server/
//
// The turns are BenchmarkStreamingTurns': 72 events over about 0.3s.
func BenchmarkGateways(b *testing.B) {
	for _, n := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("turns=%d", n), func(b *testing.B) { benchGateways(b, n) })
	}
}

func benchGateways(b *testing.B, n int) {
	dsn := testenv.Postgres(b)
	chunks := make([]string, 20)
	for i := range chunks {
		chunks[i] = fmt.Sprintf("word%d ", i)
	}
	cj, _ := json.Marshal(chunks)
	script := []string{fmt.Sprintf(`{"chunks": %s, "chunk_delay": "5ms", "tool_calls": [{"name": "work"}]}`, cj),
		fmt.Sprintf(`{"chunks": %s, "chunk_delay": "5ms"}`, cj)}
	work := goTool("work", budget.Cooperative, time.Minute, func(ctx context.Context, _ json.RawMessage, pr tool.Progress) (any, error) {
		for i := range 20 {
			v, total := float64(i+1), 20.0
			pr.Report(tool.Report{Progress: &v, Total: &total})
			time.Sleep(5 * time.Millisecond)
		}
		return "done", nil
	})
	gw := make([]*env, 2)
	for i := range gw {
		st, err := postgres.Open(context.Background(), dsn, postgres.Options{})
		if err != nil {
			b.Fatal(err)
		}
		gw[i] = newEnv(b, server.Config{Agent: newAgent(b, scripted(b, script...), work), Store: st})
		gw[i].client.Transport.(*http.Transport).MaxIdleConnsPerHost = 2 * n
	}
	size := func() int64 {
		conn, err := pgx.Connect(context.Background(), dsn)
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close(context.Background())
		var n int64
		if err := conn.QueryRow(context.Background(), `SELECT pg_database_size(current_database())`).Scan(&n); err != nil {
			b.Fatal(err)
		}
		return n
	}
	sizeBefore := size()

	var (
		mu          sync.Mutex
		same, cross []time.Duration
	)
	b.ResetTimer()
	start := time.Now()
	for i := 0; b.Loop(); i++ {
		var wg sync.WaitGroup
		for t := range n {
			origin, other := gw[t%2], gw[(t+1)%2]
			wg.Go(func() {
				s, c, err := followTwice(origin, other, fmt.Sprintf("gw-%d-%d", i, t))
				if err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				same, cross = append(same, s...), append(cross, c...)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	elapsed := time.Since(start)
	b.StopTimer()
	turns := float64(b.N * n)
	q := func(l []time.Duration, f float64) float64 {
		if len(l) == 0 {
			return 0
		}
		slices.Sort(l)
		return float64(l[min(len(l)-1, int(f*float64(len(l))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(same, 0.50), "same-p50-ms")
	b.ReportMetric(q(same, 0.99), "same-p99-ms")
	b.ReportMetric(q(cross, 0.50), "cross-p50-ms")
	b.ReportMetric(q(cross, 0.99), "cross-p99-ms")
	b.ReportMetric(q(cross, 1), "cross-max-ms")
	b.ReportMetric(turns/elapsed.Seconds(), "turns/s")
	b.ReportMetric(float64(size()-sizeBefore)/turns/1024, "db-KiB/turn")
	b.ReportMetric(0, "ns/op")
}

// followTwice starts a turn with an event stream on origin and follows it
// through other, and returns the delivery latencies of each. Only the
// events emitted once the follower's stream is open are counted for it:
// the ones before are replayed from the store, not delivered live.
func followTwice(origin, other *env, session string) (same, cross []time.Duration, err error) {
	resp, err := origin.doCtx(context.Background(), "POST", "/v1/turns", map[string]any{"input": "go", "session_id": session},
		"Accept", sseAccept)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	id := resp.Header.Get(server.HeaderTurnID)
	var (
		wg      sync.WaitGroup
		crossEr error
	)
	wg.Go(func() {
		r, err := other.doCtx(context.Background(), "GET", "/v1/turns/"+id+"/events", nil)
		if err != nil {
			crossEr = err
			return
		}
		defer r.Body.Close()
		// The stream is open (its headers came): from here every event
		// is delivered live.
		cross, crossEr = latencies(r.Body, time.Now())
	})
	same, err = latencies(resp.Body, time.Time{})
	wg.Wait()
	return same, cross, errors.Join(err, crossEr)
}

// latencies reads an SSE stream to its end and returns the delivery
// latency of each event emitted at or after since.
func latencies(body io.Reader, since time.Time) ([]time.Duration, error) {
	sse := newSSE(body)
	var out []time.Duration
	for {
		ev, err := sse.next()
		now := time.Now()
		if err != nil {
			if errors.Is(err, io.EOF) {
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
		if !h.At.Before(since) {
			out = append(out, now.Sub(h.At))
		}
		if ev.typ == "turn_finished" {
			return out, nil
		}
	}
}
