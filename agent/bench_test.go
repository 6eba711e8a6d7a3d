package agent_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/benchprof"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/script"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/store/sqlite"
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

// BenchmarkTurnWindDown parks 10,000 turns (TB_BENCH_TURNS) in a Go tool
// that waits on its context, each turn's ceiling set by its request so
// that every one expires at the same instant, and measures the wind-down:
// the process's CPU time (user+system, all goroutines and the GC) from the
// moment all are parked until every Run has returned, divided by the turns
// (wind-down-µs/turn; its part in the kernel, wind-down-sys-µs/turn) and
// the allocations it made (wind-down-allocs/turn, wind-down-B/turn); how
// late after its ceiling each Run returned (p50, p99, max); and the
// resident memory with all of them parked. A turn's ceiling is its start
// plus its budget, which its request gave as the time left to the
// instant: within half a millisecond of the instant (the budget is whole
// milliseconds), or later when its goroutine was held up between the two
// (ceilings-off-instant counts those more than a millisecond late, and
// each is measured from its own ceiling, not the instant). store is the
// same turns stored as the server stores them, in a SQLite file
// (TB_BENCH_PG=1: in PostgreSQL, internal/testenv's): a
// store.Recorder among each turn's sinks, its end stored
// (Recorder.Finish) once Run returned; it also reports how late after its
// ceiling each end was stored (stored-p99-ms, stored-last-ms). shape is
// the same wind-down with none of a turn's work (shapeOfATurn: its three
// goroutines and two contexts); floor the least the same wind-down can
// cost: a goroutine per turn waiting on a context with the same deadline.
// -benchtime Nx runs N rounds in one process (each round's turns are new
// conversations); the figures are over all of them.
func BenchmarkTurnWindDown(b *testing.B) {
	n := 10000
	if v := os.Getenv("TB_BENCH_TURNS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	ls, _ := script.Parse(strings.NewReader(`{"chunks": ["Let me ", "check."], "tool_calls": [{"name": "wait", "arguments": {"q": "x"}}]}
{"text": "done"}`), "bench")
	p, _ := script.New(ls)
	wait := tool.NewFunc("wait", "waits", nil, func(ctx context.Context, _ json.RawMessage, pr tool.Progress) (any, error) {
		pr.Report(tool.Report{}) // parked
		<-ctx.Done()
		return nil, ctx.Err()
	})
	a, err := agent.New(agent.Config{Models: []model.Endpoint{{Provider: p, ProviderName: "script", Model: "m"}},
		Tools: []agent.Tool{{Tool: wait, Budget: budget.ToolBudget{Timeout: budget.Duration{D: time.Hour}}}}})
	if err != nil {
		b.Fatal(err)
	}
	for _, mode := range []string{"turns", "store", "shape", "floor"} {
		b.Run(mode, func(b *testing.B) {
			var late, stored []time.Duration
			var w winddown
			for b.Loop() {
				l, r := windDown(b, a, n, mode)
				late = append(late, l...)
				stored = append(stored, r.stored...)
				w.cpu, w.sys, w.allocs, w.bytes, w.rss = w.cpu+r.cpu, w.sys+r.sys, w.allocs+r.allocs, w.bytes+r.bytes, max(w.rss, r.rss)
				w.offInstant += r.offInstant
			}
			slices.Sort(late)
			slices.Sort(stored)
			quantile := func(d []time.Duration, p float64) float64 {
				return float64(d[int(p*float64(len(d)-1))]) / float64(time.Millisecond)
			}
			q := func(p float64) float64 { return quantile(late, p) }
			if len(stored) > 0 {
				b.ReportMetric(quantile(stored, 0.99), "stored-p99-ms")
				b.ReportMetric(quantile(stored, 1), "stored-last-ms")
			}
			b.ReportMetric(float64(w.cpu.Microseconds())/float64(len(late)), "wind-down-µs/turn")
			b.ReportMetric(float64(w.sys.Microseconds())/float64(len(late)), "wind-down-sys-µs/turn")
			b.ReportMetric(float64(w.allocs)/float64(len(late)), "wind-down-allocs/turn")
			b.ReportMetric(float64(w.bytes)/float64(len(late)), "wind-down-B/turn")
			b.ReportMetric(q(0.50), "late-p50-ms")
			b.ReportMetric(q(0.99), "late-p99-ms")
			b.ReportMetric(q(1), "late-max-ms")
			b.ReportMetric(float64(w.rss)/(1<<20), "parked-rss-MB")
			b.ReportMetric(float64(w.offInstant), "ceilings-off-instant")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// shapeOfATurn is the least a turn stopped by its ceiling in a tool call
// does, with none of its work: the ceiling's timer (a goroutine when it
// fires) cancels the turn's context and the call's under it; the tool's
// goroutine returns; the turn's goroutine, waiting on the call's result
// and its context, takes the result and returns.
func shapeOfATurn(at time.Time, parked func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	ceiling := time.AfterFunc(time.Until(at), func() { cancel(context.DeadlineExceeded) })
	defer ceiling.Stop()
	call, stop := context.WithCancel(ctx)
	defer stop()
	result := make(chan error, 1)
	go func() {
		parked()
		<-call.Done()
		result <- call.Err()
	}()
	select {
	case <-result:
	case <-ctx.Done():
		<-result
	}
}

// winddown is what one round of BenchmarkTurnWindDown measured of the
// wind-down: the process's CPU time (and its part in the kernel), the
// allocations (count and bytes), the resident memory with every turn
// parked, and the turns whose ceiling fell more than a millisecond after
// the instant.
type winddown struct {
	cpu, sys      time.Duration
	allocs, bytes uint64
	rss           int64
	offInstant    int
	// stored is how late after its ceiling each turn's end was stored
	// (mode store).
	stored []time.Duration
}

// windDownRounds counts the rounds of BenchmarkTurnWindDown in this
// process.
var windDownRounds atomic.Int64

// windDown runs one round of BenchmarkTurnWindDown: of turns, of their
// shape alone (shapeOfATurn), or of the floor.
func windDown(b *testing.B, a *agent.Agent, n int, mode string) (late []time.Duration, w winddown) {
	// What the last round freed goes back to the system now: the runtime
	// would hand it back bit by bit, in the kernel, during this round's
	// wind-down (7-8 µs a turn of the shape's, run after the turns).
	debug.FreeOSMemory()
	session := strconv.FormatInt(windDownRounds.Add(1), 10) + "-"
	var st store.Store
	var storedAt []time.Time
	// Long enough for every turn to park first on a loaded 2-CPU machine.
	park := time.Duration(n)*time.Millisecond + 3*time.Second
	if mode == "store" {
		var err error
		if os.Getenv("TB_BENCH_PG") != "" {
			// Beginning 10,000 turns on PostgreSQL takes longer.
			st, err = postgres.Open(context.Background(), testenv.Postgres(b), postgres.Options{})
			park += 3 * time.Duration(n) * time.Millisecond
		} else {
			st, err = sqlite.Open(filepath.Join(b.TempDir(), "timebox.db"), sqlite.Options{})
		}
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		storedAt = make([]time.Time, n)
	}
	at := time.Now().Add(park)
	var parked, done sync.WaitGroup
	parked.Add(n)
	returned := make([]time.Time, n)
	// Each turn's own ceiling; the instant for shape and floor, whose
	// timers are set from it directly.
	ceilings := make([]time.Time, n)
	for i := range ceilings {
		ceilings[i] = at
	}
	for i := range n {
		done.Add(1)
		go func() {
			defer done.Done()
			switch mode {
			case "shape":
				shapeOfATurn(at, parked.Done)
				returned[i] = time.Now()
				return
			case "floor":
				ctx, cancel := context.WithDeadline(context.Background(), at)
				defer cancel()
				parked.Done()
				<-ctx.Done()
				returned[i] = time.Now()
				return
			}
			var once sync.Once
			sink := event.SinkFunc(func(e event.Event) {
				if e.Type == event.TypeToolProgress {
					once.Do(parked.Done)
				}
			})
			// A conversation of its own each round: the script plays a
			// conversation's lines in turn, and one that went on to "done"
			// would not park.
			in := agent.Input{SessionID: session + strconv.Itoa(i), Text: "hi"}
			sinks := []event.Sink{sink}
			var rec *store.Recorder
			if st != nil {
				in.TurnID, rec = agent.NewTurnID(), store.NewRecorder(st)
				if err := rec.Begin(context.Background(), store.TurnStart{TurnID: in.TurnID, SessionID: in.SessionID, Input: in.Text, StartedAt: time.Now()}); err != nil {
					b.Error(err)
				}
				sinks = []event.Sink{rec, sink}
			}
			d := time.Until(at).Round(time.Millisecond)
			in.Budgets = budget.Request{"turn": d.String()}
			res := a.Run(context.Background(), in, sinks...)
			returned[i] = time.Now()
			ceilings[i] = res.Record.StartedAt.Add(d)
			if rec != nil {
				if err := rec.Finish(context.Background(), res.Record, res.Messages); err != nil {
					b.Error(err)
				}
				storedAt[i] = time.Now()
			}
			if res.Record.StopReason != budget.TurnTimeout {
				b.Errorf("turn %d ended %s, want %s", i, res.Record.StopReason, budget.TurnTimeout)
			}
		}()
	}
	parked.Wait()
	if time.Now().After(at) {
		b.Fatalf("%d turns took longer than %s to park", n, park)
	}
	runtime.GC()
	w.rss = vmRSS()
	stopProfile := func() {}
	switch mode {
	case "turns":
		stopProfile = benchprof.Phase(b, "") // TB_BENCH_PROFILE=PREFIX
	case "store":
		stopProfile = benchprof.Phase(b, "-store")
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0) // before the instant: it stops the world
	before, beforeSys := cpuTime()
	done.Wait()
	after, afterSys := cpuTime()
	w.cpu, w.sys = after-before, afterSys-beforeSys
	runtime.ReadMemStats(&m1)
	w.allocs, w.bytes = m1.Mallocs-m0.Mallocs, m1.TotalAlloc-m0.TotalAlloc
	stopProfile()
	for i, r := range returned {
		late = append(late, r.Sub(ceilings[i]))
		if ceilings[i].Sub(at) > time.Millisecond {
			w.offInstant++
		}
		if storedAt != nil {
			w.stored = append(w.stored, storedAt[i].Sub(ceilings[i]))
		}
	}
	return late, w
}

// vmRSS is the process's resident memory now, from /proc/self/status.
func vmRSS() int64 {
	b, _ := os.ReadFile("/proc/self/status")
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// BenchmarkManyCalls measures a reply asking for TB_BENCH_CALLS (10,000)
// Go-function tool calls under the default max_tool_calls (50): the
// excess is refused, and what that costs is the time and memory of the
// turn.
func BenchmarkManyCalls(b *testing.B) {
	n := 10000
	if v := os.Getenv("TB_BENCH_CALLS"); v != "" {
		n, _ = strconv.Atoi(v)
	}
	var sb strings.Builder
	sb.WriteString(`{"tool_calls": [`)
	for i := range n {
		if i > 0 {
			sb.WriteString(",")
		}
		sb.WriteString(`{"name": "noop", "arguments": {"i": ` + strconv.Itoa(i) + `}}`)
	}
	sb.WriteString("]}\n{\"text\": \"done\"}\n")
	ls, err := script.Parse(strings.NewReader(sb.String()), "bench")
	if err != nil {
		b.Fatal(err)
	}
	p, _ := script.New(ls)
	noop := tool.NewFunc("noop", "does nothing", nil, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
		return "ok", nil
	})
	a, err := agent.New(agent.Config{Models: []model.Endpoint{{Provider: p, ProviderName: "script", Model: "m"}},
		Tools: []agent.Tool{{Tool: noop}}})
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		var events int
		res := a.Run(context.Background(), agent.Input{SessionID: "s", Text: "hi"}, event.SinkFunc(func(event.Event) { events++ }))
		if res.Record.StopReason != "answered" && res.Record.StopReason != budget.MaxToolCalls {
			b.Fatalf("stopped: %s", res.Record.StopReason)
		}
		b.ReportMetric(float64(events), "events")
	}
}
