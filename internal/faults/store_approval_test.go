//go:build faults && linux

package faults

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"testing"
)

// approvalAcrossRestart: PostgreSQL restarts while a call of a turn on
// gateway A waits for a person; the decision then comes through gateway
// B. The waiting call cannot hear B's notification (its connection to
// the database was cut), so it must find the decision by reading the
// store again: the call runs once, the turn answers, no event or record is
// lost (docs/approvals.md).
func approvalAcrossRestart(t *testing.T) {
	sc := begin(t, "pg_ctl restart while a call waits for a person, decided through the other gateway", "timebox serve ×2, --db postgres://, an SSE client")
	d := newSharedDB(t)
	a := deployAgent(t)
	gwA, urlA := d.gateway(a, 0)
	gwB, urlB := d.gateway(a, 0)
	f := postTurn(t, urlA, `{"input": "deploy"}`)
	callID := ""
	for deadline := time.Now().Add(20 * time.Second); callID == "" && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		callID = pendingCall(urlA, f.turnID)
	}
	if callID == "" {
		t.Fatal("the call never waited for a decision")
	}
	d.pg.Restart()
	// Decide through B as soon as it can store the decision.
	decided, status := time.Time{}, 0
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		resp, err := http.Post(urlB+"/v1/turns/"+f.turnID+"/approvals/"+callID, "application/json",
			strings.NewReader(`{"decision": "approve", "by": "faults"}`))
		if err != nil {
			continue
		}
		resp.Body.Close()
		if status = resp.StatusCode; status != http.StatusServiceUnavailable && status != http.StatusInternalServerError {
			decided = time.Now()
			break
		}
	}
	sc.count("decision through B once the database is back (HTTP status)", status, http.StatusAccepted)
	_, ok := streamEnd(f, 30*time.Second)
	sc.truth("A's client got turn_finished", "yes", fmt.Sprint(ok), ok)
	if !decided.IsZero() {
		sc.within("decision to the turn's end", time.Since(decided), 10*time.Second)
	}
	rec, evs, _ := d.ended(f.turnID, 30*time.Second)
	sc.count("healthy turns interrupted", interrupted(rec), 0)
	sc.count("times the approved call ran", ranTimes(a), 1)
	if rec != nil {
		sc.records(f.log.snapshot(), rec, evs)
	}
	stopGateways(t, gwA, gwB)
	sc.nothingLeft(gwA.pid(), gwB.pid())
}
