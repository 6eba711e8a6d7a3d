//go:build faults && linux

package faults

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
)

// workerKilledWhileApproving: on the Temporal engine, the worker of a turn
// whose call waits for a person is killed (SIGKILL) and another started;
// the decision then comes through `timebox serve`, a signal to the
// workflow. The wait is the workflow's (a signal and a timer), not the
// worker's: the new worker runs the call once and the turn answers, the
// person asked once (docs/approvals.md).
func workerKilledWhileApproving(t *testing.T) {
	sc := begin(t, "worker kill -9 while a call waits for a person", "timebox worker ×2, serve --engine temporal, the decision by its route")
	e := newEngine(t)
	a := deployAgent(t)
	wa := e.worker(a, nil, "1s")
	gw, url := startServe(t, a, nil, append([]string{"--engine", "temporal"}, e.flags(a)...)...)
	turnID, callID := waitingCall(t, url, `{"input": "deploy", "detach": true}`)
	wa.cmd.Process.Kill()
	<-wa.done
	wb := e.worker(a, nil, "1s")
	decided := time.Now()
	resp, err := http.Post(url+"/v1/turns/"+turnID+"/approvals/"+callID, "application/json", strings.NewReader(`{"decision": "approve", "by": "faults"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	sc.truth("decision through serve (HTTP status)", "200 or 202", http.StatusText(resp.StatusCode),
		resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusAccepted)
	rec, evs := e.ended(turnID, 60*time.Second)
	sc.within("decision to the turn's end, on the new worker", time.Since(decided), 15*time.Second)
	sc.is("status", string(rec.Status), string(budget.StatusCompleted))
	sc.count("times the approved call ran", ranTimes(a), 1)
	asked := 0
	for _, ev := range evs {
		if ev.Type == event.TypeApprovalRequested {
			asked++
		}
	}
	sc.count("times the person was asked", asked, 1)
	sc.integrity(evs, nil)
	stop(wb)
	stopGateways(t, gw)
	sc.nothingLeft(gw.pid())
}
