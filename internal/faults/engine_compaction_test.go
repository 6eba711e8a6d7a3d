//go:build faults && linux

package faults

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
)

// workerKilledMidCompaction: the worker of a turn that compacts its
// session's history is killed (SIGKILL) during the compaction's model
// call, and another started. The lost compaction gets a record, as a lost
// model attempt does (compaction_finished: interrupted, worker_lost), and
// the compaction tried again on the new worker is attempt 2.
func workerKilledMidCompaction(t *testing.T) {
	sc := begin(t, "worker kill -9 mid-compaction", "timebox worker ×2, run --engine temporal ×2")
	e := newEngine(t)
	recv := e.trace()
	chunks := make([]string, 20)
	for i := range chunks {
		chunks[i] = fmt.Sprintf("%q", fmt.Sprintf("summary %d. ", i))
	}
	// The session's first turn answers; the second compacts its history
	// with the script's compaction line (3s), is killed meanwhile,
	// compacts again on the new worker (the script's place travels with
	// the turn: the same line), and answers.
	a := newAgent(t, scriptAgent("", "", "{name: none, description: Nothing., exec: [true]}")+"context: {compact_at: 50}\n",
		[]string{`{"text": "First answer."}`, `{"compaction": true, "chunks": [` + strings.Join(chunks, ", ") + `], "chunk_delay": "150ms"}`,
			`{"text": "All done."}`}, nil)
	wa := e.worker(a, nil, "1s")
	turn := func(text string) *proc {
		return startTimebox(t, a.dir, e.env, nil, append(append([]string{"run", "--engine", "temporal", "--json", "--session", "s"}, e.flags(a)...), text)...)
	}
	first := turn(strings.Repeat("a long question ", 40))
	firstID := turnID(t, first)
	if rec, _ := e.ended(firstID, 60*time.Second); rec.Status != budget.StatusCompleted {
		t.Fatalf("the first turn ended %s: %s", rec.StopReason, rec.Message)
	}
	first.wait(10 * time.Second)
	run := turn("and now?")
	id := turnID(t, run)
	if _, ok := run.log.waitFor(event.TypeCompactionStarted, 30*time.Second); !ok {
		t.Fatalf("no compaction\n%s", run.stderr.String())
	}
	_, rec, evs, wb, took := e.workerLost(wa, a, nil, id)
	run.wait(10 * time.Second)
	sc.is("status", string(rec.Status), string(budget.StatusCompleted))
	sc.within("kill to turn_finished", took, 20*time.Second)
	sc.integrity(evs, run.log.snapshot())
	var lost, done, other int
	for _, mc := range rec.ModelCalls {
		switch {
		case !mc.Compaction:
		case mc.Outcome == event.OutcomeInterrupted && mc.Phase == budget.PhaseWorkerLost && mc.Attempt == 1:
			lost++
		case mc.Outcome != event.OutcomeInterrupted && mc.Attempt == 2:
			done++
		default:
			other++
		}
	}
	sc.truth("compaction records", "attempt 1 worker_lost, attempt 2 ended", fmt.Sprintf("%d lost, %d ended, %d other", lost, done, other),
		lost == 1 && done == 1 && other == 0)
	ends := 0
	for _, ev := range evs {
		if ev.Type == event.TypeCompactionFinished {
			ends++
		}
	}
	sc.count("compaction_finished events", ends, 2)
	stop(wb)
	sc.traceWhole(recv, "", firstID, id)
	sc.nothingLeft()
}
