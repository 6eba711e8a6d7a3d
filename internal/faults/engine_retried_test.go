//go:build faults && linux

package faults

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.temporal.io/sdk/client"
	sdklog "go.temporal.io/sdk/log"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/temporal"
)

// retriedTool reports progress five times and hangs the first time it
// runs; run again, it answers at once.
const retriedTool = `#!/usr/bin/env bash
cat >/dev/null
echo "root $$" >> "$PIDFILE"
if [ -e ran ]; then echo again; exit 0; fi
touch ran
for i in 1 2 3 4 5; do echo "::progress:: {\"progress\": $i, \"total\": 10}" >&2; done
exec sleep 300
`

// workerKilledMidRetriedTool: the worker running a call of a tool that
// declares retries is killed (SIGKILL); the call is run again on a second
// worker. Its one record says it ran twice, since when, and counts the
// progress the lost run reported.
func workerKilledMidRetriedTool(t *testing.T) {
	sc := begin(t, "worker kill -9 mid-tool, retries: 1", "timebox worker ×2, run --engine temporal")
	e := newEngine(t)
	recv := e.trace()
	a := newAgent(t, scriptAgent("kill_grace: 500ms", "", "{name: flaky, description: Safe to run twice., exec: [./flaky.sh], timeout: 10m, retries: 1}"),
		[]string{callTools("flaky"), `{"text": "All done."}`}, map[string]string{"flaky.sh": retriedTool})
	env := []string{"PIDFILE=" + a.pidfile}
	wa := e.worker(a, env, "1s")
	run := e.run(a, env)
	id := turnID(t, run)
	// Killed once a heartbeat has carried the five reports to Temporal.
	c, err := client.Dial(client.Options{HostPort: e.srv.Addr(), Logger: sdklog.NewStructuredLogger(slog.New(slog.DiscardHandler))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wait.For(t, 30*time.Second, "a heartbeat with the five reports", func() bool {
		d, err := c.DescribeWorkflowExecution(context.Background(), temporal.WorkflowID(id), "")
		if err != nil {
			return false
		}
		for _, pa := range d.GetPendingActivities() {
			for _, p := range pa.GetHeartbeatDetails().GetPayloads() {
				if strings.Contains(string(p.GetData()), `"reports":5`) {
					return true
				}
			}
		}
		return false
	})
	_, rec, evs, wb, took := e.workerLost(wa, a, env, id)
	code := run.wait(10 * time.Second)
	sc.is("status", string(rec.Status), string(budget.StatusCompleted))
	sc.count("run's exit code", code, 0)
	sc.within("kill to turn_finished", took, 15*time.Second)
	sc.integrity(evs, run.log.snapshot())
	if cs := rec.ToolCalls; len(cs) == 1 {
		tc := cs[0]
		sc.is("the call", string(tc.Outcome), string(event.OutcomeOK))
		sc.count("its runs", tc.Runs, 2)
		sc.truth("its first_started_at", "before the run that answered", fmt.Sprintf("%s before", ms(tc.StartedAt.Sub(tc.FirstStartedAt))),
			!tc.FirstStartedAt.IsZero() && tc.FirstStartedAt.Before(tc.StartedAt))
		sc.count("its progress_count (the lost run's reports)", tc.ProgressCount, 5)
	} else {
		sc.count("tool call records", len(cs), 1)
	}
	stop(wb)
	if !sc.traceWhole(recv, "", id) {
		// Who did not make the turn's span, should it recur: the worker's
		// note (the runner then leaves the span to it), how run exited,
		// both processes' logs. Its one failure (docs/RELIABILITY.md) had
		// the trace of a worker stopped before its unit ended the span it
		// noted, which Stop now waits for (TestTurnSpanOfAWorkerStopping).
		note := e.st.Payload(context.Background(), id, "turn-span", func([]byte) error { return nil })
		t.Logf("the worker's turn-span note: %v (nil: written); run exited %d after %s\nrun:\n%s\nworker B:\n%s",
			note, code, ms(run.took), run.stderr.String(), wb.stderr.String())
	}
	sc.nothingLeft()
}
