//go:build linux

package exectool_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/benchprof"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/proctree"
	"github.com/timebox-run/timebox/tool"
	"github.com/timebox-run/timebox/tool/exectool"
)

// hungTree is a hung tool of two processes: a shell waiting on a sleep.
// It reports progress once the sleep runs (its /proc comm says so: until
// the child has exec'd, it is a copy of the shell that would take SIGTERM
// with the shell's trap and survive it). On SIGTERM, which both get, the
// shell reaps the sleep and exits, so the tree goes away without leaving
// zombies for an init that may not reap them. Only shell builtins run
// besides the sleep.
var hungTree = []string{"/bin/sh", "-c", `trap 'wait; exit 143' TERM
sleep 3600 &
until read -r c < /proc/$!/comm && [ "$c" = sleep ]; do :; done
echo '::progress:: started' >&2
wait`}

// BenchmarkDeadlinePrecision measures how long after a hung call's
// deadline its whole process tree is gone and its timeout result ready, for
// 1,000 hung calls through tool.Run with hard enforcement. It reports
// p50, p99 and max in milliseconds. Run it with -benchtime=1x
// (docs/BENCHMARKS.md has the command and figures).
//
//   - spread: each call has its own 1s timeout. The calls are launched one
//     after another, each once the previous one's tree is running, so every
//     call is hung when its deadline fires; the deadlines are spread as the
//     launches were. peak-hung reports how many calls were hung at once,
//     which is 1,000 only where the machine starts 1,000 trees within the
//     1s timeout.
//   - burst: all 1,000 calls are launched and hung first, then stopped at
//     one instant by their context (a tool-phase timeout as its cause, so
//     the runner and the tool take the same path as at a deadline): the
//     worst case, every stop at once.
//   - at-once: all 1,000 calls are launched at one instant, each with its
//     own 1s timeout, and the figure is how long after its deadline each
//     returned. A call whose deadline passes while it waits to be started
//     starts nothing (its figure is then how soon it gave up); peak-hung
//     says how many trees were running at once.
//
// raw-os-exec is the floor to compare with: the same calls through the same
// runner, by a tool that starts the program with plain os/exec in its own
// process group and, when stopped, sends the group SIGTERM and waits for
// the root — the least a tool can do, with none of the escape handling.
func BenchmarkDeadlinePrecision(b *testing.B) {
	const calls = 1000
	for _, mode := range []string{"spread", "burst", "at-once"} {
		for _, s := range []proctree.Strategy{proctree.Cgroup, proctree.Track, "raw-os-exec"} {
			b.Run(mode+"/"+string(s), func(b *testing.B) {
				var tl tool.Tool = rawTool{}
				if s != "raw-os-exec" {
					if _, err := proctree.Resolve(s); err != nil {
						b.Skip(err)
					}
					et, err := exectool.New(exectool.Config{Spec: tool.Spec{Name: "hung"}, Argv: hungTree, ProcTree: s})
					if err != nil {
						b.Fatal(err)
					}
					tl = et
				}
				var late []time.Duration
				peak := 0
				for b.Loop() {
					var l []time.Duration
					var p int
					switch mode {
					case "spread":
						l, p = spread(b, tl, calls)
					case "burst":
						l, p = burst(b, tl, calls)
					default:
						l, p = atOnce(b, tl, calls)
					}
					late = append(late, l...)
					peak = max(peak, p)
				}
				slices.Sort(late)
				q := func(p float64) float64 {
					return float64(late[int(p*float64(len(late)-1))]) / float64(time.Millisecond)
				}
				b.ReportMetric(q(0.50), "p50-ms")
				b.ReportMetric(q(0.99), "p99-ms")
				b.ReportMetric(q(1), "max-ms")
				b.ReportMetric(float64(peak), "peak-hung")
				b.ReportMetric(0, "ns/op")
				if left := proctest.Leaks(5 * time.Second); left != nil {
					b.Fatalf("leaked: %v", left)
				}
			})
		}
	}
}

func hungBudget(timeout time.Duration) budget.ToolBudget {
	return budget.ToolBudget{Timeout: budget.Duration{D: timeout, Source: budget.SourceTool, Knob: "tools[hung].timeout"},
		Enforcement: budget.Hard, KillGrace: budget.Duration{D: 2 * time.Second}}
}

// launch starts one call of tl under b and returns once its tree is
// running (or the call ended without getting that far). hung counts the
// calls whose tree is running; peak is its maximum. done receives the
// execution and the instant Run returned.
func launch(ctx context.Context, tl tool.Tool, b budget.ToolBudget, hung, peak *atomic.Int64, done func(*tool.Execution, time.Time)) {
	started := make(chan struct{})
	var once sync.Once
	reported := false
	go func() {
		x := tool.Run(ctx, tl, &tool.Call{ID: "c", Tool: "hung"}, b, tool.Hooks{OnProgress: func(tool.Report) {
			once.Do(func() {
				reported = true
				n := hung.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				close(started)
			})
		}})
		ready := time.Now()
		once.Do(func() { close(started) })
		if reported {
			hung.Add(-1)
		}
		done(x, ready)
	}()
	<-started
}

// results gathers the calls' lateness and any outcome other than
// timed_out.
type results struct {
	mu   sync.Mutex
	late []time.Duration
	bad  map[event.Outcome]int
}

func (r *results) add(x *tool.Execution, late time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if x.Outcome != event.OutcomeTimedOut {
		if r.bad == nil {
			r.bad = map[event.Outcome]int{}
		}
		r.bad[x.Outcome]++
	}
	r.late = append(r.late, late)
}

func (r *results) check(b *testing.B) []time.Duration {
	if len(r.bad) > 0 {
		b.Fatalf("outcomes other than timed_out: %v", r.bad)
	}
	return r.late
}

func spread(b *testing.B, tl tool.Tool, calls int) ([]time.Duration, int) {
	const timeout = time.Second
	var hung, peak atomic.Int64
	var wg sync.WaitGroup
	var r results
	for range calls {
		wg.Add(1)
		launch(context.Background(), tl, hungBudget(timeout), &hung, &peak, func(x *tool.Execution, ready time.Time) {
			defer wg.Done()
			r.add(x, ready.Sub(x.Started.Add(timeout)))
		})
	}
	wg.Wait()
	return r.check(b), int(peak.Load())
}

func atOnce(b *testing.B, tl tool.Tool, calls int) ([]time.Duration, int) {
	const timeout = time.Second
	var hung, peak atomic.Int64
	var wg sync.WaitGroup
	var r results
	gate := make(chan struct{})
	for range calls {
		wg.Add(1)
		go func() {
			<-gate
			launch(context.Background(), tl, hungBudget(timeout), &hung, &peak, func(x *tool.Execution, ready time.Time) {
				defer wg.Done()
				r.add(x, ready.Sub(x.Started.Add(timeout)))
			})
		}()
	}
	close(gate)
	wg.Wait()
	return r.check(b), int(peak.Load())
}

// profiles numbers the bursts' profiles.
var profiles int

func burst(b *testing.B, tl tool.Tool, calls int) ([]time.Duration, int) {
	// One context per call: the runner fills in the elapsed time of the
	// cause it is stopped with, so the calls must not share one.
	cancels := make([]context.CancelCauseFunc, calls)
	stoppedAt := make([]time.Time, calls)
	var hung, peak atomic.Int64
	var wg sync.WaitGroup
	var stopping sync.Mutex // held while the stops are sent, so that stoppedAt is complete
	var r results
	for i := range calls {
		ctx, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		cancels[i] = cancel
		wg.Add(1)
		launch(ctx, tl, hungBudget(time.Hour), &hung, &peak, func(x *tool.Execution, ready time.Time) {
			defer wg.Done()
			stopping.Lock()
			at := stoppedAt[i]
			stopping.Unlock()
			r.add(x, ready.Sub(at))
		})
	}
	profiles++
	stopProfile := benchprof.Phase(b, fmt.Sprintf(".%d", profiles)) // TB_BENCH_PROFILE=PREFIX: the stops alone
	stopping.Lock()
	for i, cancel := range cancels {
		stoppedAt[i] = time.Now()
		cancel(&budget.TimeoutError{Phase: budget.PhaseTool, Limit: time.Hour, Source: budget.SourceTool, Knob: "tools[hung].timeout"})
	}
	stopping.Unlock()
	wg.Wait()
	stopProfile()
	return r.check(b), int(peak.Load())
}

// rawTool runs hungTree with plain os/exec, for the floor of
// BenchmarkDeadlinePrecision.
type rawTool struct{}

func (rawTool) Spec() tool.Spec { return tool.Spec{Name: "hung"} }

// OwnsProcesses: the runner waits for it as for the exec tool, never
// abandoning it, so that both are timed to the end of their trees.
func (rawTool) OwnsProcesses()  {}
func (rawTool) Kind() tool.Kind { return tool.KindExec }
func (rawTool) Call(ctx context.Context, c *tool.Call) (*tool.Result, error) {
	cmd := exec.Command(hungTree[0], hungTree[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = w
	err = cmd.Start()
	w.Close()
	if err != nil {
		r.Close()
		return nil, err
	}
	go func() {
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "::progress::") {
				c.Progress.Report(tool.Report{})
			}
		}
	}()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return &tool.Result{}, err
	case <-ctx.Done():
		syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		<-done // the shell reaps the sleep before it exits
		return &tool.Result{}, context.Cause(ctx)
	}
}

// trueProgram is the program whose fork/exec/wait is the baseline.
const trueProgram = "/bin/true"

// BenchmarkCallOverhead compares one exec tool call of /bin/true with a raw
// os/exec fork/exec/wait of it. The sub-benchmarks give each on its own;
// ratio-* runs them alternately (so that drift in the machine's speed hits
// all alike) and reports exec-tool time over raw time (ratio), and over
// the same program through os/exec with the tool's three pipes
// (ratio-piped).
func BenchmarkCallOverhead(b *testing.B) {
	raw := func(b *testing.B) {
		if err := exec.Command(trueProgram).Run(); err != nil {
			b.Fatal(err)
		}
	}
	// piped is the floor of any exec tool that passes a request and reads
	// a result: the same program through os/exec with the three pipes the
	// tool uses (the request on stdin, stdout and stderr read).
	piped := func(b *testing.B) {
		c := exec.Command(trueProgram)
		var out, errOut strings.Builder
		c.Stdin, c.Stdout, c.Stderr = strings.NewReader(`{"x": 1}`), &out, &errOut
		if err := c.Run(); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("raw-os-exec", func(b *testing.B) {
		for b.Loop() {
			raw(b)
		}
	})
	for _, s := range []proctree.Strategy{proctree.Cgroup, proctree.Track} {
		tl, err := exectool.New(exectool.Config{Spec: tool.Spec{Name: "true"}, Argv: []string{trueProgram}, ProcTree: s})
		if err != nil {
			b.Fatal(err)
		}
		one := func(b *testing.B) {
			if _, err := tl.Call(context.Background(), &tool.Call{ID: "c", Input: []byte(`{"x": 1}`)}); err != nil {
				b.Fatal(err)
			}
		}
		viaRun := func(b *testing.B) {
			x := tool.Run(context.Background(), tl, &tool.Call{ID: "c", Input: []byte(`{"x": 1}`)},
				budget.ToolBudget{Timeout: budget.Duration{D: time.Minute}, Enforcement: budget.Hard, KillGrace: budget.Duration{D: 2 * time.Second}}, tool.Hooks{})
			if x.Outcome != event.OutcomeOK {
				b.Fatal(x.Outcome, x.Err)
			}
		}
		b.Run("exectool-"+string(s), func(b *testing.B) {
			if _, err := proctree.Resolve(s); err != nil {
				b.Skip(err)
			}
			for b.Loop() {
				one(b)
			}
		})
		b.Run("run-"+string(s), func(b *testing.B) {
			if _, err := proctree.Resolve(s); err != nil {
				b.Skip(err)
			}
			for b.Loop() {
				viaRun(b)
			}
		})
		b.Run("ratio-"+string(s), func(b *testing.B) {
			if _, err := proctree.Resolve(s); err != nil {
				b.Skip(err)
			}
			var tRaw, tPiped, tTool time.Duration
			for b.Loop() {
				t0 := time.Now()
				raw(b)
				t1 := time.Now()
				piped(b)
				t2 := time.Now()
				one(b)
				tTool += time.Since(t2)
				tPiped += t2.Sub(t1)
				tRaw += t1.Sub(t0)
			}
			b.ReportMetric(float64(tTool)/float64(tRaw), "ratio")
			b.ReportMetric(float64(tTool)/float64(tPiped), "ratio-piped")
			b.ReportMetric(float64(tRaw.Microseconds())/float64(b.N), "raw-µs/op")
			b.ReportMetric(float64(tPiped.Microseconds())/float64(b.N), "piped-µs/op")
			b.ReportMetric(float64(tTool.Microseconds())/float64(b.N), "tool-µs/op")
		})
	}
}
