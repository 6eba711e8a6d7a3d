//go:build faults && linux

package faults

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
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
	// A new turn through A, and reads of A's turn through B (which does
	// not run it, so each reads the store), all at once.
	var (
		status, body string
		newTook      time.Duration
		wg           sync.WaitGroup
	)
	wg.Go(func() {
		var code int
		code, body, newTook = ask("POST", urlA+"/v1/turns", `{"input": "now?", "detach": true}`, hang)
		status = fmt.Sprint(code)
	})
	reads := hungReads(urlB, fA.turnID)
	readsDuring := make([]hungRead, len(reads))
	for i, r := range reads {
		wg.Go(func() {
			readsDuring[i] = r
			readsDuring[i].code, readsDuring[i].body, readsDuring[i].took = ask("GET", urlB+r.path, "", hang)
		})
	}
	wg.Wait()
	sc.truth("a new turn while the database hangs", "503 store_unavailable", fmt.Sprintf("%s %.60s", status, body),
		status == "503" && strings.Contains(body, "store_unavailable"))
	sc.within("  answered after", newTook, 7*time.Second)
	var (
		got     []string
		all503  = true
		slowest time.Duration
	)
	for _, r := range readsDuring {
		ok := r.code == http.StatusServiceUnavailable && strings.Contains(r.body, "store_unavailable")
		all503 = all503 && ok
		got = append(got, fmt.Sprintf("%s %d", r.name, r.code))
		slowest = max(slowest, r.took)
	}
	sc.truth("reads through B while the database hangs (a turn, the list, its events, the sessions)", "503 store_unavailable",
		strings.Join(got, ", "), all503)
	sc.within("  slowest read's answer", slowest, 7*time.Second)
	if rest := time.Until(frozen.Add(hang)); rest > 0 {
		time.Sleep(rest)
	}
	peakA, peakB := procmem.Peak(gwA.pid()), procmem.Peak(gwB.pid())
	thaw()
	back := time.Now()

	recA := d.back(sc, back, fA, fB, cross, endA, peakA, peakB)
	got = got[:0]
	all200 := true
	for _, r := range hungReads(urlB, fA.turnID) {
		code, _, _ := ask("GET", urlB+r.path, "", 10*time.Second)
		all200 = all200 && code == http.StatusOK
		got = append(got, fmt.Sprintf("%s %d", r.name, code))
	}
	sc.truth("the same reads once the database goes on", "200", strings.Join(got, ", "), all200)
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

// hungRead is a read of the store through a gateway, and how it was
// answered.
type hungRead struct {
	name, path string
	code       int
	body       string
	took       time.Duration
}

// hungReads are the reads of turn id that a gateway which does not run it
// answers from the store: its record, the list, its events (the stream
// reads the record first), its session.
func hungReads(url, id string) []hungRead {
	return []hungRead{
		{name: "turn", path: "/v1/turns/" + id + "?events=false"},
		{name: "list", path: "/v1/turns"},
		{name: "events", path: "/v1/turns/" + id + "/events?after=0"},
		{name: "sessions", path: "/v1/sessions"},
	}
}

// ask sends one request and returns its status, its body (its first 64
// KiB; a stream to its end) and how long the answer took; an error's text
// for the body, status 0, when none came within limit.
func ask(method, url, body string, limit time.Duration) (int, string, time.Duration) {
	c := http.Client{Timeout: limit}
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		return 0, err.Error(), 0
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		return 0, err.Error(), time.Since(start)
	}
	defer resp.Body.Close()
	took := time.Since(start)
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	return resp.StatusCode, string(b), took
}
