//go:build faults && linux

package faults

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/procmem"
)

// databaseHung: PostgreSQL is stopped with SIGSTOP (the postmaster and
// every backend) for hang while two gateways run a turn each: the
// database takes connections and statements and answers nothing, as a
// frozen VM or a stalled disk does — no write fails, each waits. A's turn
// ends during the hang, B's runs across it, a client of B follows A's
// turn. The clients get every event and turn_finished on time, a new turn
// is refused within 5 s (503 store_unavailable), and once the database
// goes on, the ends are stored and no healthy turn is taken for gone.
// Before 2026-11-28 each gateway took the other for gone at the thaw and
// interrupted its turn (the answered turn stored as interrupted, 25 events
// refused), and the new turn's client waited for as long as the hang.
func databaseHung(t *testing.T, hang time.Duration) {
	sc := begin(t, fmt.Sprintf("PostgreSQL SIGSTOPped %s mid-turn", hang), "timebox serve ×2, --db postgres://…&timebox_heartbeat=2s, SSE clients")
	d := newSharedDB(t)
	a := workAgent(t, "")
	gwA, urlA := d.gateway(a, 3)
	gwB, urlB := d.gateway(a, int((hang+4*time.Second)/time.Second))
	fA := postTurn(t, urlA, `{"input": "go"}`)
	fB := postTurn(t, urlB, `{"input": "go"}`)
	pids := a.waitPIDs(t, 2, gwA)
	cross := replayTurn(t, urlB, fA.turnID)
	time.Sleep(time.Second)

	d.pg.Freeze()
	frozen := time.Now()
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			d.pg.Thaw()
		}
	}
	defer thaw() // before the cluster's removal, however the test ends
	endA, ok := streamEnd(fA, hang-time.Second)
	sc.truth("A's client got turn_finished while the database hung", "yes", fmt.Sprint(ok), ok)
	if ok {
		sc.within("  after the database hung", time.Since(frozen), hang)
	}
	code, _ := health(urlA)
	sc.truth("/healthz of A while the database hangs", "503", fmt.Sprint(code), code == http.StatusServiceUnavailable)
	asked := time.Now()
	status, body := 0, ""
	c := http.Client{Timeout: hang}
	if resp, err := c.Post(urlA+"/v1/turns", "application/json", strings.NewReader(`{"input": "now?", "detach": true}`)); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		status, body = resp.StatusCode, string(b)
	} else {
		body = err.Error()
	}
	sc.truth("a new turn while the database hangs", "503 store_unavailable", fmt.Sprintf("%d %.60s", status, body),
		status == http.StatusServiceUnavailable && strings.Contains(body, "store_unavailable"))
	sc.within("  answered after", time.Since(asked), 7*time.Second)
	if rest := time.Until(frozen.Add(hang)); rest > 0 {
		time.Sleep(rest)
	}
	peakA, peakB := procmem.Peak(gwA.pid()), procmem.Peak(gwB.pid())
	thaw()
	back := time.Now()

	recA := d.back(sc, back, fA, fB, cross, endA, peakA, peakB)
	if recA != nil {
		sessionBusyAfter(t, sc, urlB, recA.SessionID)
	}
	sc.truth("/healthz of A and B 200 again", "within 10 s", "", healthyAgain(urlA, 10*time.Second) && healthyAgain(urlB, 10*time.Second))
	gone := 0
	for _, g := range []*proc{gwA, gwB} {
		if strings.Contains(g.stderr.String(), "took this one for gone") {
			gone++
		}
	}
	sc.count("gateways taken for gone (their logs say so)", gone, 0)
	stopGateways(t, gwA, gwB)
	sc.allDead(pids)
	sc.nothingLeft(gwA.pid(), gwB.pid())
}
