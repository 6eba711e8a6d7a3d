//go:build linux

package exectool_test

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/proctree"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/tool"
	"github.com/timebox-run/timebox/tool/exectool"
)

// TestBurstOfHungHardCalls starts many hung hard calls at one instant (200,
// or testenv.EnvBurstCalls: TB_TEST_BURST_CALLS=1000), each
// with a 1s timeout: every one must end timed_out (none abandoned, even
// those whose deadline passed before their process could be started), and
// no process may be left. It logs the figures the fault suite reports.
func TestBurstOfHungHardCalls(t *testing.T) {
	calls := 200
	if v := os.Getenv(testenv.EnvBurstCalls); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("%s=%q is not a positive number", testenv.EnvBurstCalls, v)
		}
		calls = n
	}
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skip("no sleep program:", err)
	}
	forEachStrategy(t, func(t *testing.T, s proctree.Strategy) {
		tl, err := exectool.New(exectool.Config{Spec: tool.Spec{Name: "hung"}, Argv: []string{sleep, "1000"}, ProcTree: s})
		if err != nil {
			t.Fatal(err)
		}
		// A short kill grace: sleep dies at SIGTERM, and a runner that
		// abandoned calls would do it after this grace plus ReapMargin.
		const timeout = time.Second
		b := hungBudget(timeout)
		b.KillGrace.D = 100 * time.Millisecond
		outcomes := map[event.Outcome]int{}
		abandoned, started := 0, 0
		late := make([]time.Duration, 0, calls)
		var mu sync.Mutex
		var wg sync.WaitGroup
		gate := make(chan struct{})
		start := time.Now()
		for i := range calls {
			wg.Go(func() {
				<-gate
				x := tool.Run(context.Background(), tl, &tool.Call{ID: "c" + strconv.Itoa(i), Tool: "hung"}, b, tool.Hooks{})
				returned := time.Now()
				mu.Lock()
				defer mu.Unlock()
				outcomes[x.Outcome]++
				if x.Result != nil {
					started++
				}
				if x.Abandoned {
					abandoned++
				}
				late = append(late, returned.Sub(x.Started.Add(timeout)))
			})
		}
		close(gate)
		wg.Wait()
		wall := time.Since(start)
		// Every call has returned: a process still alive now outlived its
		// call, however soon it would go (an abandoned call's process, which
		// a CLI exiting now would leave to init).
		atReturn, err := proctree.Running()
		if err != nil {
			t.Fatal(err)
		}
		left := proctest.Leaks(5 * time.Second)
		slices.Sort(late)
		p99 := late[int(0.99*float64(len(late)-1))]
		t.Logf("%d calls (%d started): outcomes %v, abandoned %d, alive when the calls had returned %d, survivors after 5s %d, wall %s, past the deadline p50 %s p99 %s max %s",
			calls, started, outcomes, abandoned, len(atReturn), len(left), wall.Round(time.Millisecond),
			late[len(late)/2].Round(time.Millisecond), p99.Round(time.Millisecond), late[len(late)-1].Round(time.Millisecond))
		if outcomes[event.OutcomeTimedOut] != calls || abandoned != 0 {
			t.Errorf("outcomes %v, %d abandoned; want %d timed_out", outcomes, abandoned, calls)
		}
		if len(atReturn) > 0 {
			t.Errorf("%d processes were alive when their calls had returned, first %s", len(atReturn), atReturn[0])
		}
		if len(left) > 0 {
			t.Errorf("%d processes survived, first %s", len(left), left[0])
		}
	})
}
