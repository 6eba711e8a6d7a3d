//go:build faults && linux

package faults

import (
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
)

// noWorkerLeft: the only worker is killed (SIGKILL) mid-tool, and none is
// started for a while. Nothing of the turn can run, not even its ceiling;
// `run` following it says so, with a still_working notice whose waiting
// field names the task queue, instead of showing the call running on.
// Then a worker starts, the lost call is reported, and the turn answers.
func noWorkerLeft(t *testing.T) {
	sc := begin(t, "every worker kill -9 mid-tool", "timebox worker, run --engine temporal")
	e := newEngine(t)
	a := newAgent(t, scriptAgent("kill_grace: 500ms", "", "{name: hang, description: Hangs., exec: [./hang.sh], timeout: 10m}"),
		[]string{callTools("hang"), `{"text": "All done."}`}, map[string]string{"hang.sh": hangTool})
	wa, run, id, pids := e.hanging(a, "1s")
	killed := time.Now()
	wa.cmd.Process.Kill()
	<-wa.done
	var said *event.StillWorking
	for deadline := time.Now().Add(40 * time.Second); said == nil && time.Now().Before(deadline) && !run.exited(); time.Sleep(50 * time.Millisecond) {
		for _, ev := range run.log.snapshot() {
			if n, ok := ev.Data.(*event.StillWorking); ok && n.Waiting != "" {
				said = n
			}
		}
	}
	if said == nil {
		sc.truth("run said no worker takes the turn", "yes", "no", false)
		t.Fatalf("no notice 40s after the only worker was killed\n%s", run.stderr.String())
	}
	// The call's heartbeat timeout (1s), then WorkerWait (10s) of work no
	// worker took, then the follower's next look (every 2s).
	sc.within("kill to the notice that no worker takes the turn", time.Since(killed), 20*time.Second)
	sc.truth("the notice names the task queue", e.queue, said.Waiting, containsAll(said.Waiting, e.queue, "no timebox worker"))
	sc.count("turn ended with no worker", boolInt(run.exited()), 0)
	wb := e.worker(a, nil, "1s")
	rec, evs := e.ended(id, 60*time.Second)
	code := run.wait(10 * time.Second)
	sc.is("status once a worker came", string(rec.Status), string(budget.StatusCompleted))
	sc.count("run's exit code", code, 0)
	sc.integrity(evs, run.log.snapshot())
	if c := rec.ToolCalls; len(c) == 1 {
		sc.is("the lost call", string(c[0].Outcome)+"/"+string(c[0].Phase), "interrupted/worker_lost")
	} else {
		sc.count("tool call records", len(c), 1)
	}
	sc.allDead(pids)
	stop(wb)
	sc.nothingLeft()
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
