//go:build faults && linux

package faults

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctree"
)

// burst: issue 9's burst — a model asking for 1,000 calls of a hung
// hard tool at once (`sleep 1000`, timeout 1s, limits.parallel_tools
// 1000) — through `timebox run`, under both process-tree strategies. Every
// call ends timed_out, none abandoned, including those whose deadline
// passed before their process could be started; no process survives; each
// call has its record, stored. tool/exectool's TestBurstOfHungHardCalls is
// the same burst through the library (TB_TEST_BURST_CALLS=1000).
func burst(t *testing.T) {
	const calls = 1000
	names := make([]string, calls)
	for i := range names {
		names[i] = "hung"
	}
	for _, s := range []proctree.Strategy{proctree.Cgroup, proctree.Track} {
		t.Run(string(s), func(t *testing.T) {
			if _, err := proctree.Resolve(s); err != nil {
				t.Skip(err)
			}
			sc := begin(t, fmt.Sprintf("1,000-call burst (%s)", s), "timebox run --json")
			a := newAgent(t, scriptAgent("kill_grace: 100ms", fmt.Sprintf("parallel_tools: %d, max_tool_calls: %d", calls, calls),
				"{name: hung, description: Hangs., exec: [sleep, '1000'], timeout: 1s}"),
				[]string{callTools(names...), `{"text": "done"}`}, nil)
			p := startTimebox(t, a.dir, []string{proctree.EnvStrategy + "=" + string(s)}, nil, "run", "-f", a.file, "--db", a.db, "--json", "go")
			if code := p.wait(120 * time.Second); code != 0 {
				t.Fatalf("exit %d\n%s", code, p.stderr.String())
			}
			seen := p.log.snapshot()
			outcomes := map[event.Outcome]int{}
			abandoned := 0
			var past []time.Duration
			for _, r := range toolRecords(seen) {
				outcomes[r.Outcome]++
				if r.Abandoned {
					abandoned++
				}
				past = append(past, time.Duration(r.DurationMS-r.TimeoutMS)*time.Millisecond)
			}
			if len(past) == 0 {
				t.Fatalf("no call ended\n%s", p.stderr.String())
			}
			slices.Sort(past)
			var o []string
			for k, v := range outcomes {
				o = append(o, fmt.Sprintf("%s %d", k, v))
			}
			slices.Sort(o)
			t.Logf("outcomes: %s; turn %s", strings.Join(o, ", "), p.took.Round(time.Millisecond))
			sc.count("calls timed_out", outcomes[event.OutcomeTimedOut], calls)
			sc.count("calls abandoned", abandoned, 0)
			sc.within("past the deadline, p99", past[len(past)*99/100], 2*time.Second)
			sc.within("past the deadline, max", past[len(past)-1], 5*time.Second)
			sc.nothingLeft(p.pid())
			st, evs := stored(t, a.db, "")
			sc.count("stored call records", len(st.ToolCalls), calls)
			sc.records(seen, st, evs)
			sc.memory("peak memory of timebox", p.peak(), 300)
		})
	}
}
