//go:build faults && linux

package faults

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/timebox-run/timebox/event"
)

// webhooksAcrossRestarts: two gateways share one PostgreSQL database and
// send four events of each turn to a receiver that takes 200 ms to answer;
// PostgreSQL restarts twice (pg_ctl restart) while eight turns run and end,
// their deliveries being stored, claimed, sent and recorded. Every event
// is delivered, each webhook-id answered 2xx once: no delivery lost with a
// cut connection, none sent twice for an attempt whose record waited for
// the database (docs/webhooks.md).
func webhooksAcrossRestarts(t *testing.T) {
	sc := begin(t, "webhooks on PostgreSQL across pg_ctl restart ×2", "timebox serve ×2, --db postgres://, server.webhooks to a receiver that answers in 200 ms")
	h := &hookReceiver{ok: map[string]int{}}
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(200 * time.Millisecond)
		h.ServeHTTP(w, r)
	}))
	defer rc.Close()
	d := newSharedDB(t)
	y := "name: faults\nmodel: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\n" +
		"server:\n  webhooks:\n    - {url: " + rc.URL + "/hook, events: [turn_started, tool_started, tool_finished, turn_finished], secret_env: HOOK_SECRET}\n" +
		"tools:\n  - {name: work, description: Works a while., exec: [./work.sh], timeout: 2m}\n"
	a := newAgent(t, y, []string{callTools("work"), `{"text": "fine"}`}, map[string]string{"work.sh": workTool})
	env := []string{"PIDFILE=" + a.pidfile, "WORK_SECONDS=2", "HOOK_SECRET=" + faultsWhsec}
	gwA, urlA := startServe(t, a, env, "--db", d.dsn)
	gwB, urlB := startServe(t, a, env, "--db", d.dsn)
	const turns, each = 8, 4
	var fs []*follower
	for i := range turns {
		fs = append(fs, postTurn(t, []string{urlA, urlB}[i%2], `{"input": "go"}`))
		time.Sleep(250 * time.Millisecond)
	}
	d.pg.Restart()
	time.Sleep(1500 * time.Millisecond)
	d.pg.Restart()
	restarted := time.Now()
	completed := 0
	for _, f := range fs {
		if e, ok := f.log.waitFor(event.TypeTurnFinished, 30*time.Second); ok && e.Data.(*event.TurnFinished).Status == "completed" {
			completed++
		}
	}
	sc.count("turns completed", completed, turns)
	var ok map[string]int
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if _, _, ok = h.stats(); len(ok) >= turns*each {
			break
		}
	}
	sc.count("distinct webhook-ids answered 2xx", len(ok), turns*each)
	sc.within("  the last of them after the second restart", time.Since(restarted), 30*time.Second)
	var by map[string]int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if by, _ = deliveryStates(urlA); by["delivered"] == turns*each {
			break
		}
	}
	sc.count("deliveries recorded delivered", by["delivered"], turns*each)
	_, _, ok = h.stats()
	twice := 0
	for _, n := range ok {
		if n > 1 {
			twice++
		}
	}
	sc.count("events answered 2xx more than once", twice, 0)
	stopGateways(t, gwA, gwB)
	sc.nothingLeft(gwA.pid(), gwB.pid())
}
