//go:build faults && linux

package faults

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
)

// cutter terminates every connection to a database but its own, on
// demand: a scenario cuts, then at once asks a gateway something, so that
// the gateway's pool hands out a connection the cut has killed.
type cutter struct {
	t    *testing.T
	conn *pgx.Conn
	cuts int64
}

func newCutter(t *testing.T, dsn string) *cutter {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return &cutter{t: t, conn: conn}
}

// cut terminates the connections and adds how many to c.cuts.
func (c *cutter) cut() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var n int64
	if err := c.conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n); err != nil {
		c.t.Fatalf("terminating the connections: %v", err)
	}
	c.cuts += n
}

// answers counts the answers of a gateway by their class.
type answers struct {
	mu        sync.Mutex
	n, failed int
	failures  []string
}

// get asks url and counts its answer: a 5xx (or no answer) is a failure.
// An SSE stream is left after its headers.
func (a *answers) get(url string, sse bool) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		panic(err)
	}
	if sse {
		req.Header.Set("Accept", "text/event-stream")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		a.add(url, 0, err.Error())
		return
	}
	defer resp.Body.Close()
	var body []byte
	if !sse || resp.StatusCode != http.StatusOK {
		body, _ = io.ReadAll(resp.Body)
	}
	a.add(url, resp.StatusCode, string(body))
}

func (a *answers) add(url string, status int, body string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n++
	if status == 0 || status >= 500 {
		a.failed++
		if len(a.failures) < 3 {
			a.failures = append(a.failures, fmt.Sprintf("%s: %d %.200s", url, status, body))
		}
	}
}

// cutUnderReadsAndCancel: a turn runs on gateway A; every connection of
// both gateways is cut (pg_terminate_backend) every 250 ms, and right
// after each cut the turn is read through gateway B (GET /v1/turns/{id},
// and its event stream); after a few cuts it is cancelled through B, right
// after a cut too. B's pool hands out connections the cut killed: each
// read must answer all the same (not 5xx), the cancel must be taken (200
// or 202) and end the turn `cancelled` on A. Before 2026-11-28 the reads
// answered 500 and the cancel was lost: 500, the turn ran on
// (docs/decisions/store-outages.md, "A read after connections were cut").
func cutUnderReadsAndCancel(t *testing.T) {
	sc := begin(t, "connections killed every 250 ms, the turn read and cancelled through the other gateway",
		"timebox serve ×2, --db postgres://, reads and a cancel through B right after each cut")
	d := newSharedDB(t)
	a := workAgent(t, "")
	gwA, urlA := d.gateway(a, 60)
	gwB, urlB := d.gateway(a, 60)
	fA := postTurn(t, urlA, `{"input": "go"}`)
	pids := a.waitPIDs(t, 1, gwA)
	c := newCutter(t, d.url)
	var reads answers
	read := func() {
		reads.get(urlB+"/v1/turns/"+fA.turnID, false)
		reads.get(urlB+"/v1/turns/"+fA.turnID+"/events?after=0", true)
	}
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for range 8 {
		c.cut()
		read()
		<-tick.C
	}

	// The cancel, right after a cut; reads and cuts go on while it waits.
	c.cut()
	cancelled := time.Now()
	var cancelStatus int
	var cancelBody string
	var asking sync.WaitGroup
	asking.Go(func() {
		resp, err := http.Post(urlB+"/v1/turns/"+fA.turnID+"/cancel", "application/json", nil)
		if err != nil {
			cancelBody = err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancelStatus, cancelBody = resp.StatusCode, string(b)
	})
	var end event.Event
	ended := false
	for deadline := time.Now().Add(15 * time.Second); !ended && time.Now().Before(deadline); {
		read()
		end, ended = fA.log.waitFor(event.TypeTurnFinished, 250*time.Millisecond)
		c.cut()
	}
	took := time.Since(cancelled)
	asking.Wait()
	sc.truth("the cancel through B was taken", "200 or 202", fmt.Sprintf("%d %.80s", cancelStatus, cancelBody),
		cancelStatus == http.StatusOK || cancelStatus == http.StatusAccepted)
	sc.truth("A's client got turn_finished", "yes", fmt.Sprint(ended), ended)
	if ended {
		fin := end.Data.(*event.TurnFinished)
		sc.is("its status", fmt.Sprintf("%s/%s", fin.Status, fin.StopReason), "cancelled/cancelled")
		sc.within("cancel to A's turn_finished", took, 5*time.Second)
	}
	sc.truth("connections killed", "> 0", fmt.Sprint(c.cuts), c.cuts > 0)
	if reads.failed > 0 {
		t.Logf("failed reads: %v", reads.failures)
	}
	sc.count(fmt.Sprintf("reads through B that failed (5xx), of %d", reads.n), reads.failed, 0)
	rec, evs, _ := d.ended(fA.turnID, 30*time.Second)
	if rec != nil {
		sc.is("stored status", string(rec.Status), string(budget.StatusCancelled))
		sc.records(fA.log.snapshot(), rec, evs)
	}
	stopGateways(t, gwA, gwB)
	sc.allDead(pids)
	sc.nothingLeft(gwA.pid(), gwB.pid())
}
