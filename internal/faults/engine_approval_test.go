//go:build faults && linux

package faults

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
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
	y := scriptAgent("", "", `{name: deploy, exec: [./deploy.sh], approval: required, timeout: 5s}`)
	a := newAgent(t, y, []string{`{"tool_calls": [{"name": "deploy", "arguments": {"env": "prod"}}]}`, `{"text": "deployed"}`},
		map[string]string{"deploy.sh": "#!/bin/sh\ncat >/dev/null\necho run >> runs\necho deployed\n"})
	wa := e.worker(a, nil, "1s")
	gw, url := startServe(t, a, nil, append([]string{"--engine", "temporal"}, e.flags(a)...)...)
	resp, err := http.Post(url+"/v1/turns", "application/json", strings.NewReader(`{"input": "deploy", "detach": true}`))
	if err != nil {
		t.Fatal(err)
	}
	var acc struct {
		TurnID string `json:"turn_id"`
	}
	json.NewDecoder(resp.Body).Decode(&acc)
	resp.Body.Close()
	callID := ""
	for deadline := time.Now().Add(60 * time.Second); callID == "" && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		callID = pendingCall(url, acc.TurnID)
	}
	if callID == "" {
		t.Fatalf("the call never waited for a decision\n%s\n%s", gw.stderr.String(), wa.stderr.String())
	}
	wa.cmd.Process.Kill()
	<-wa.done
	wb := e.worker(a, nil, "1s")
	decided := time.Now()
	resp, err = http.Post(url+"/v1/turns/"+acc.TurnID+"/approvals/"+callID, "application/json", strings.NewReader(`{"decision": "approve", "by": "faults"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	sc.truth("decision through serve (HTTP status)", "200 or 202", http.StatusText(resp.StatusCode),
		resp.StatusCode == http.StatusOK || resp.StatusCode == http.StatusAccepted)
	rec, evs := e.ended(acc.TurnID, 60*time.Second)
	sc.within("decision to the turn's end, on the new worker", time.Since(decided), 15*time.Second)
	sc.is("status", string(rec.Status), string(budget.StatusCompleted))
	runs, _ := os.ReadFile(filepath.Join(a.dir, "runs"))
	sc.count("times the approved call ran", strings.Count(string(runs), "run"), 1)
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
