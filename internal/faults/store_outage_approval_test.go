//go:build faults && linux

package faults

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/event"
)

// decision posts an approval of a call to a gateway and returns the
// status, the body and the Retry-After header of its answer.
func decision(url, turnID, callID string) (int, string, string) {
	c := http.Client{Timeout: 30 * time.Second}
	resp, err := c.Post(url+"/v1/turns/"+turnID+"/approvals/"+callID, "application/json",
		strings.NewReader(`{"decision": "approve", "by": "faults"}`))
	if err != nil {
		return 0, err.Error(), ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), resp.Header.Get("Retry-After")
}

// approvalDuringOutage: PostgreSQL is stopped for down while a call of a
// turn on gateway A waits for a person. A decision through A and through
// B during the outage cannot be stored: each is answered 503
// store_unavailable with Retry-After, and the call goes on waiting; the
// same decision sent again once the database is back is taken, the call
// runs once and the turn answers, nothing lost. Before 2026-11-28 the
// decisions during the outage got 500 store_error, whose message sent the
// person to the server's log (docs/approvals.md).
func approvalDuringOutage(t *testing.T, down time.Duration) {
	sc := begin(t, fmt.Sprintf("PostgreSQL stopped %s while a call waits for a person", down), "timebox serve ×2, --db postgres://, decisions through both during and after")
	d := newSharedDB(t)
	a := deployAgent(t)
	gwA, urlA := d.gateway(a, 0)
	gwB, urlB := d.gateway(a, 0)
	f := postTurn(t, urlA, `{"input": "deploy"}`)
	callID := ""
	wait := time.Now().Add(20 * time.Second)
	for ; callID == "" && time.Now().Before(wait); time.Sleep(20 * time.Millisecond) {
		callID = pendingCall(urlA, f.turnID)
	}
	if callID == "" {
		t.Fatal("the call never waited for a decision")
	}
	d.pg.Stop()
	stopped := time.Now()
	for _, g := range []struct{ name, url string }{{"A (where the call waits)", urlA}, {"B", urlB}} {
		status, body, retry := decision(g.url, f.turnID, callID)
		sc.truth("a decision through "+g.name+" during the outage", "503 store_unavailable, Retry-After",
			fmt.Sprintf("%d %.40s, Retry-After %q", status, body, retry),
			status == http.StatusServiceUnavailable && strings.Contains(body, "store_unavailable") && retry != "")
	}
	_, ended := f.log.waitFor(event.TypeToolFinished, time.Until(stopped.Add(down)))
	sc.truth("the call waited on through the outage", "yes", fmt.Sprint(!ended), !ended)
	if rest := time.Until(stopped.Add(down)); rest > 0 {
		time.Sleep(rest)
	}
	d.pg.Start()
	back := time.Now()
	status, tries := 0, 0
	var body string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		tries++
		if status, body, _ = decision(urlB, f.turnID, callID); status != http.StatusServiceUnavailable {
			break
		}
	}
	decided := time.Now()
	sc.truth("the decision through B once the database is back", "202", fmt.Sprintf("%d %.60s", status, body), status == http.StatusAccepted)
	sc.within(fmt.Sprintf("  database back to the decision taken (%d tries, 100 ms apart)", tries), decided.Sub(back), 10*time.Second)
	end, ok := f.log.waitFor(event.TypeTurnFinished, 30*time.Second)
	sc.truth("A's client got turn_finished", "yes", fmt.Sprint(ok), ok)
	if ok {
		sc.within("  decision to the turn's end", time.Since(decided), 10*time.Second)
		fin := end.Data.(*event.TurnFinished)
		sc.is("its status", fmt.Sprintf("%s/%s", fin.Status, fin.StopReason), "completed/answered")
	}
	sc.count("times the approved call ran", ranTimes(a), 1)
	rec, evs, _ := d.ended(f.turnID, 30*time.Second)
	sc.count("healthy turns interrupted", interrupted(rec), 0)
	if rec != nil {
		sc.records(f.log.snapshot(), rec, evs)
	}
	stopGateways(t, gwA, gwB)
	sc.nothingLeft(gwA.pid(), gwB.pid())
}
