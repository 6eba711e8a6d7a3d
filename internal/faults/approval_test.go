//go:build faults && linux

package faults

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/testenv"
)

// serveRestartWhileApproving: `timebox serve` stops (SIGTERM) while a call
// waits for a person; the next serve on the same SQLite file resumes the
// turn, a decision through it runs the call once, and the turn ends with
// every record and no event missing (docs/approvals.md).
func serveRestartWhileApproving(t *testing.T) {
	sc := begin(t, "serve restarted while a call waits for a person", "timebox serve ×2 in turn on one SQLite file, a tool with approval: required, SIGTERM while it waits")
	a := deployAgent(t)
	recv := testenv.NewOTLP(t)
	gw, url := startServe(t, a, traced(recv))
	turnID, callID := waitingCall(t, url, `{"input": "deploy", "detach": true}`)
	stopped := time.Now()
	stopGateways(t, gw)
	sc.within("serve stopped after SIGTERM", time.Since(stopped), 10*time.Second)

	gw2, url2 := startServe(t, a, traced(recv))
	decided := time.Now()
	resp, err := http.Post(url2+"/v1/turns/"+turnID+"/approvals/"+callID, "application/json", strings.NewReader(`{"decision": "approve", "by": "faults"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	sc.count("decision through the new serve (HTTP status)", resp.StatusCode, http.StatusOK)
	var rec struct {
		Status     string            `json:"status"`
		ToolCalls  []json.RawMessage `json:"tool_calls"`
		Events     []json.RawMessage `json:"events"`
		ApprovalMS int64             `json:"approval_ms"`
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		r, err := http.Get(url2 + "/v1/turns/" + turnID)
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(r.Body).Decode(&rec)
		r.Body.Close()
		if rec.Status != "running" {
			break
		}
	}
	sc.within("  turn ended after the decision", time.Since(decided), 10*time.Second)
	sc.is("turn status", rec.Status, "completed")
	sc.count("times the approved call ran", ranTimes(a), 1)
	sc.count("tool call records", len(rec.ToolCalls), 1)
	gaps, asked := 0, 0
	for i, raw := range rec.Events {
		var e struct {
			Seq  int64  `json:"seq"`
			Type string `json:"type"`
		}
		json.Unmarshal(raw, &e)
		if e.Seq != int64(i+1) {
			gaps++
		}
		if e.Type == "approval_requested" {
			asked++
		}
	}
	sc.count("events missing or out of order across the restart", gaps, 0)
	sc.count("times the person was asked", asked, 1)
	sc.truth("turn's approval_ms covers the restart", "> 0", fmt.Sprint(rec.ApprovalMS), rec.ApprovalMS > 0)
	stopGateways(t, gw2)
	sc.traceWhole(recv, "", turnID)
	sc.nothingLeft(gw.pid(), gw2.pid())
}

// deployAgent is an agent whose model calls deploy, a tool that needs
// approval and notes each run in the file runs, then answers.
func deployAgent(t *testing.T) agentDir {
	t.Helper()
	y := scriptAgent("", "", `{name: deploy, exec: [./deploy.sh], approval: required, timeout: 5s}`)
	return newAgent(t, y, []string{`{"tool_calls": [{"name": "deploy", "arguments": {"env": "prod"}}]}`, `{"text": "deployed"}`},
		map[string]string{"deploy.sh": "#!/bin/sh\ncat >/dev/null\necho run >> runs\necho deployed\n"})
}

// ranTimes counts the runs of deployAgent's tool.
func ranTimes(a agentDir) int {
	runs, _ := os.ReadFile(filepath.Join(a.dir, "runs"))
	return strings.Count(string(runs), "run")
}

// waitingCall posts a detached turn to serve and waits until its call
// waits for a decision: it returns the turn's and the call's ids.
func waitingCall(t *testing.T, url, body string) (turnID, callID string) {
	t.Helper()
	resp, err := http.Post(url+"/v1/turns", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var acc struct {
		TurnID string `json:"turn_id"`
	}
	json.NewDecoder(resp.Body).Decode(&acc)
	resp.Body.Close()
	for deadline := time.Now().Add(60 * time.Second); callID == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		callID = pendingCall(url, acc.TurnID)
	}
	if callID == "" {
		t.Fatal("the call never waited for a decision")
	}
	return acc.TurnID, callID
}

// pendingCall returns the id of a call of the turn that waits for a
// decision, "" when none does yet.
func pendingCall(url, turnID string) string {
	r, err := http.Get(url + "/v1/turns/" + turnID + "/approvals")
	if err != nil {
		return ""
	}
	defer r.Body.Close()
	var list struct {
		Approvals []struct {
			CallID   string `json:"call_id"`
			Decision string `json:"decision"`
		} `json:"approvals"`
	}
	json.NewDecoder(r.Body).Decode(&list)
	for _, a := range list.Approvals {
		if a.Decision == "" {
			return a.CallID
		}
	}
	return ""
}
