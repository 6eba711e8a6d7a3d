//go:build faults && linux

package faults

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/procmem"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
)

// TestStoreFaults runs the faults of the stores against the real
// databases: a PostgreSQL cluster of each scenario's own (stopped,
// restarted, locked, its connections killed) shared by `timebox serve`
// gateways, and a SQLite file another process locks. Each scenario
// measures events and records lost, healthy turns interrupted, the time
// from the database's return to the turn's stored end, and memory while
// the store is away (docs/RELIABILITY.md, "The store under outages").
func TestStoreFaults(t *testing.T) {
	for _, s := range []struct {
		name string
		run  func(*testing.T)
	}{
		{"PostgreSQL stopped 8 s", func(t *testing.T) { databaseStopped(t, 8*time.Second) }},
		{"PostgreSQL stopped 30 s", func(t *testing.T) { databaseStopped(t, 30*time.Second) }},
		{"PostgreSQL SIGSTOPped 12 s", func(t *testing.T) { databaseHung(t, 12*time.Second) }},
		{"pg_ctl restart ×2", databaseRestarted},
		{"SIGTERM to serve during an outage", shutdownDuringOutage},
		{"events table locked 20 s", tableLocked},
		{"SQLite file locked 20 s", fileLocked},
		{"SQLite's disk full, then room again", diskFullThenRoom},
		{"SQLite's disk full under serve, a client joins", diskFullUnderServe},
		{"SQLite's disk full, then serve restarted while a call waits for a person", diskFullThenSuspended},
		{"pg_terminate_backend loop", connectionsKilled},
		{"pg_terminate_backend loop, read and cancelled through the other gateway", cutUnderReadsAndCancel},
		{"two writers number one turn while commits fail", twoWritersNumber},
		{"pg_ctl restart while a call waits for a person", approvalAcrossRestart},
		{"PostgreSQL stopped 10 s while a call waits for a person", func(t *testing.T) { approvalDuringOutage(t, 10*time.Second) }},
		{"long reply on PostgreSQL", longReplyPostgres},
		{"long reply on PostgreSQL, connections killed", longReplyConnectionsKilled},
		{"gateway kill -9 on PostgreSQL, its turn ended by another", gatewayKilled},
	} {
		t.Run(s.name, s.run)
	}
}

// workTool works $WORK_SECONDS seconds (set per gateway), saying so ten
// times a second, then answers.
const workTool = `#!/usr/bin/env bash
cat >/dev/null
echo "root $$" >> "$PIDFILE"
n=$(( ${WORK_SECONDS:-3} * 10 ))
for i in $(seq 1 $n); do echo "::progress:: $i of $n" >&2; sleep 0.1; done
echo "worked ${WORK_SECONDS:-3} s"
`

// workAgent is an agent whose model calls the work tool, then answers.
func workAgent(t *testing.T, timeouts string) agentDir {
	t.Helper()
	return newAgent(t, scriptAgent(timeouts, "", "{name: work, description: Works a while., exec: [./work.sh], timeout: 2m}"),
		[]string{callTools("work"), `{"text": "All done."}`}, map[string]string{"work.sh": workTool})
}

// sharedDB is a scenario's PostgreSQL: a cluster of its own, one database
// whose stores heartbeat every 2s (a gone process is judged in 6s), and a
// store of the test's to read what the gateways stored.
type sharedDB struct {
	t   *testing.T
	pg  *testenv.PostgresServer
	url string // the database's URL
	dsn string // with timebox_heartbeat, for the stores
	st  *postgres.Store
}

func newSharedDB(t *testing.T) *sharedDB {
	t.Helper()
	pg := testenv.StartPostgres(t)
	d := &sharedDB{t: t, pg: pg, url: pg.Database()}
	d.dsn = d.url + "&" + postgres.HeartbeatParam + "=2s"
	st, err := postgres.Open(context.Background(), d.dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d.st = st
	return d
}

// gateway starts `timebox serve` for a on the shared database, its work
// tool working seconds.
func (d *sharedDB) gateway(a agentDir, seconds int) (*proc, string) {
	d.t.Helper()
	return startServe(d.t, a, []string{"PIDFILE=" + a.pidfile, fmt.Sprintf("WORK_SECONDS=%d", seconds)}, "--db", d.dsn)
}

// ended waits up to d for turn id to end in the store, polling (the
// database may have just come back), and returns its record and events.
func (d *sharedDB) ended(id string, within time.Duration) (*event.Turn, []event.Event, bool) {
	d.t.Helper()
	ctx := context.Background()
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		rec, err := d.st.Turn(ctx, id)
		if err != nil || rec.Status == budget.StatusRunning {
			continue
		}
		evs, err := d.st.Events(ctx, id, 0, 0)
		if err != nil {
			continue
		}
		return rec, evs, true
	}
	d.t.Errorf("turn %s had not ended in the store after %s", id, within)
	return nil, nil, false
}

// health returns a gateway's /healthz status code and body.
func health(url string) (int, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url + "/healthz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// healthyAgain waits up to d for /healthz to answer 200.
func healthyAgain(url string, d time.Duration) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if code, _ := health(url); code == http.StatusOK {
			return true
		}
	}
	return false
}

// back asserts what two gateways' turns left once the database is back
// (at back): A's end stored within 10 s, B's turn and the stream of A's
// through B ended, no healthy turn interrupted, no record or event lost
// or twice, A's stored wall_ms its turn's, and the gateways' peak memory
// by then. It returns A's stored turn (nil: none).
func (d *sharedDB) back(sc *scenario, back time.Time, fA, fB, cross *follower, endA *event.TurnFinished, peakA, peakB int64) *event.Turn {
	sc.t.Helper()
	recA, evsA, _ := d.ended(fA.turnID, 60*time.Second)
	sc.within("database back to A's stored end", time.Since(back), 10*time.Second)
	_, okB := streamEnd(fB, 60*time.Second)
	recB, evsB, _ := d.ended(fB.turnID, 60*time.Second)
	_, okCross := streamEnd(cross, 30*time.Second)
	sc.truth("B's client of A's turn got turn_finished", "yes", fmt.Sprint(okCross), okCross)
	sc.truth("B's client got turn_finished", "yes", fmt.Sprint(okB), okB)
	sc.count("healthy turns interrupted", interrupted(recA, recB), 0)
	if recA != nil && recB != nil {
		sc.records(fA.log.snapshot(), recA, evsA)
		sc.records(fB.log.snapshot(), recB, evsB)
		lostA, _ := missing(fA.log.snapshot(), evsA)
		lostB, _ := missing(fB.log.snapshot(), evsB)
		lostX, twiceX := missing(fA.log.snapshot(), cross.log.snapshot())
		sc.count("events lost (A's, B's, of the stream through B)", lostA+lostB+lostX, 0)
		sc.count("events twice in the stream through B", twiceX, 0)
		if endA != nil {
			sc.truth("stored wall_ms of A: the turn's, not the store's", "= turn_finished's",
				fmt.Sprintf("%d, turn_finished %d", recA.WallMS, endA.Totals.WallMS), recA.WallMS == endA.Totals.WallMS)
		}
	}
	sc.memory("peak memory of gateway A by the database's return", peakA, 150)
	sc.memory("peak memory of gateway B by the database's return", peakB, 150)
	return recA
}

// streamEnd waits up to d for a follower's turn_finished.
func streamEnd(f *follower, d time.Duration) (*event.TurnFinished, bool) {
	e, ok := f.log.waitFor(event.TypeTurnFinished, d)
	if !ok {
		return nil, false
	}
	return e.Data.(*event.TurnFinished), true
}

// missing counts the events of want (a stream complete to its end) that
// got lacks, by seq and type, and the events got has twice.
func missing(want, got []event.Event) (lost, twice int) {
	have := map[int64]event.Type{}
	for _, e := range got {
		if _, ok := have[e.Seq]; ok {
			twice++
		}
		have[e.Seq] = e.Type
	}
	for _, e := range want {
		if typ, ok := have[e.Seq]; !ok || typ != e.Type {
			lost++
		}
	}
	return lost, twice
}

// interrupted counts the turns that did not answer.
func interrupted(recs ...*event.Turn) int {
	n := 0
	for _, r := range recs {
		if r == nil || r.Status != budget.StatusCompleted {
			n++
		}
	}
	return n
}

// gatewayKilled: of two gateways on one PostgreSQL database, traced, A
// is killed with SIGKILL mid-tool. B takes A for gone (3 heartbeats of
// 2 s) and marks its turn interrupted, and B makes the turn's span, which
// died with A, under which A had exported its model call's span: the trace
// is whole (docs/decisions/turn-span-of-a-lost-turn.md).
func gatewayKilled(t *testing.T) {
	sc := begin(t, "gateway kill -9 mid-tool on PostgreSQL, its turn ended by another", "timebox serve ×2, --db postgres://…&timebox_heartbeat=2s, traced")
	d := newSharedDB(t)
	// The test's own store is a process on the database too: it would
	// take A for gone as B does, and it makes no span. Here it reads,
	// and judges no one (its heartbeat, an hour, is when it would look).
	d.st.Close()
	st, err := postgres.Open(context.Background(), d.url, postgres.Options{Heartbeat: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	d.st = st
	a := workAgent(t, "")
	recv := testenv.NewOTLP(t)
	gw := func(seconds int) (*proc, string) {
		return startServe(t, a, append([]string{"PIDFILE=" + a.pidfile, fmt.Sprintf("WORK_SECONDS=%d", seconds)}, traced(recv)...), "--db", d.dsn)
	}
	gwA, urlA := gw(60)
	gwB, _ := gw(1)
	f := postTurn(t, urlA, `{"input": "go"}`)
	pids := a.waitPIDs(t, 1, gwA)
	waitSpans(t, recv, "chat ", 1) // the model call's span names the turn's, which dies with A
	killed := time.Now()
	gwA.cmd.Process.Kill()
	<-gwA.done
	rec, evs, ok := d.ended(f.turnID, 30*time.Second)
	if !ok {
		t.Fatalf("A's turn not ended\n%s", gwB.stderr.String())
	}
	sc.is("A's turn, ended by B", string(rec.Status), string(budget.StatusInterrupted))
	sc.truth("B said", "it marked A's turn interrupted", fmt.Sprint(strings.Contains(gwB.stderr.String(), "marked turns interrupted")),
		strings.Contains(gwB.stderr.String(), "marked turns interrupted"))
	sc.within("kill to its end stored", time.Since(killed), 20*time.Second)
	sc.count("turn_finished events stored", countType(evs, event.TypeTurnFinished), 1)
	sc.allDead(pids)
	stopGateways(t, gwB)
	sc.traceWhole(recv, "", f.turnID)
	sc.nothingLeft(gwA.pid(), gwB.pid())
}

// stopGateways sends SIGTERM to each gateway and waits for it to exit.
func stopGateways(t *testing.T, gws ...*proc) {
	t.Helper()
	for _, g := range gws {
		g.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, g := range gws {
		if code := g.wait(60 * time.Second); code != 0 {
			t.Errorf("serve exited %d after SIGTERM\n%s", code, g.stderr.String())
		}
	}
}

// databaseStopped: PostgreSQL is stopped for down while two gateways run
// a turn each; A's turn ends during the outage, B's runs across it, a
// client of B follows A's turn. Nothing is lost: A's client gets its
// turn_finished while the database is away, A's end is stored once it is
// back, no healthy turn is taken for gone (the first gateway back judges
// no one), the session takes its next turn and a cancel works.
func databaseStopped(t *testing.T, down time.Duration) {
	sc := begin(t, fmt.Sprintf("PostgreSQL stopped %s mid-turn", down), "timebox serve ×2, --db postgres://…&timebox_heartbeat=2s, SSE clients")
	d := newSharedDB(t)
	a := workAgent(t, "")
	gwA, urlA := d.gateway(a, 3)
	gwB, urlB := d.gateway(a, int((down+8*time.Second)/time.Second))
	fA := postTurn(t, urlA, `{"input": "go"}`)
	fB := postTurn(t, urlB, `{"input": "go"}`)
	pids := a.waitPIDs(t, 2, gwA)
	cross := replayTurn(t, urlB, fA.turnID) // A's turn, followed through B
	time.Sleep(time.Second)

	stopped := time.Now()
	d.pg.Stop()
	endA, ok := streamEnd(fA, down)
	sc.truth("A's client got turn_finished while the database was down", "yes", fmt.Sprint(ok), ok)
	if ok {
		sc.within("  after the database stopped", time.Since(stopped), down)
	}
	code, body := health(urlA)
	sc.truth("/healthz of A while the database is down", "503", fmt.Sprint(code), code == http.StatusServiceUnavailable)
	t.Logf("/healthz: %s", body)
	if resp, err := http.Post(urlA+"/v1/turns", "application/json", strings.NewReader(`{"input": "now?", "detach": true}`)); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		sc.truth("a new turn while the database is down", "503 store_unavailable", fmt.Sprintf("%d %.40s", resp.StatusCode, b),
			resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(b), "store_unavailable"))
	}
	if rest := time.Until(stopped.Add(down)); rest > 0 {
		time.Sleep(rest)
	}
	peakA, peakB := procmem.Peak(gwA.pid()), procmem.Peak(gwB.pid())
	for _, g := range []struct{ name, url string }{{"A", urlA}, {"B", urlB}} {
		_, body := health(g.url)
		var h struct {
			Behind *store.Backlog `json:"store_behind"`
		}
		json.Unmarshal([]byte(body), &h)
		kept := "none"
		if h.Behind != nil {
			kept = fmt.Sprintf("%d events, %.1f KB", h.Behind.Events, float64(h.Behind.Bytes)/1e3)
		}
		sc.truth("events "+g.name+" kept for the store at its return", fmt.Sprintf("≤ %d events, 64 MiB", store.MaxQueued), kept,
			h.Behind == nil || (h.Behind.Events <= store.MaxQueued && h.Behind.Bytes <= 64<<20))
	}
	d.pg.Start()
	back := time.Now()

	recA := d.back(sc, back, fA, fB, cross, endA, peakA, peakB)
	logged := strings.Contains(gwA.stderr.String(), "cannot store")
	sc.truth("A logged that it keeps what it cannot store", "yes", fmt.Sprint(logged), logged)

	// The session of A's turn takes its next turn (on B), which a cancel
	// ends.
	if recA != nil {
		sessionBusyAfter(t, sc, urlB, recA.SessionID)
	}
	sc.truth("/healthz of A and B 200 again", "within 10 s", "", healthyAgain(urlA, 10*time.Second) && healthyAgain(urlB, 10*time.Second))
	stopGateways(t, gwA, gwB)
	sc.allDead(pids)
	sc.nothingLeft(gwA.pid(), gwB.pid())
}

// sessionBusyAfter posts a detached turn in session to url, which must be
// accepted (the session is not held by a turn that ended during the
// outage), and cancels it, which must end it.
func sessionBusyAfter(t *testing.T, sc *scenario, url, session string) {
	t.Helper()
	resp, err := http.Post(url+"/v1/turns", "application/json", strings.NewReader(fmt.Sprintf(`{"input": "again", "session_id": %q, "detach": true}`, session)))
	if err != nil {
		t.Fatal(err)
	}
	var started struct {
		TurnID string `json:"turn_id"`
	}
	json.NewDecoder(resp.Body).Decode(&started)
	resp.Body.Close()
	sc.is("the session's next turn", fmt.Sprint(resp.StatusCode), "202")
	if resp.StatusCode != http.StatusAccepted {
		return
	}
	resp, err = http.Post(url+"/v1/turns/"+started.TurnID+"/cancel", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var rec *event.Turn
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if r, err := turnRecord(url, started.TurnID); err == nil && r.Status != budget.StatusRunning {
			rec = r
			break
		}
	}
	got := "still running after 30 s"
	if rec != nil {
		got = string(rec.Status)
	}
	sc.is("a cancel of it", got, string(budget.StatusCancelled))
}

// databaseRestarted: `pg_ctl restart` twice, 2 s apart, while a turn runs
// on gateway A and a client follows it through gateway B: the follower
// resumes from its seq each time and ends with turn_finished, every event
// once.
func databaseRestarted(t *testing.T) {
	sc := begin(t, "pg_ctl restart ×2 with a follower on another gateway", "timebox serve ×2, --db postgres://, SSE clients")
	d := newSharedDB(t)
	a := workAgent(t, "")
	gwA, urlA := d.gateway(a, 8)
	gwB, urlB := d.gateway(a, 8)
	fA := postTurn(t, urlA, `{"input": "go"}`)
	pids := a.waitPIDs(t, 1, gwA)
	cross := replayTurn(t, urlB, fA.turnID)
	time.Sleep(time.Second)
	d.pg.Restart()
	time.Sleep(2 * time.Second)
	d.pg.Restart()
	back := time.Now()
	_, ok := streamEnd(fA, 60*time.Second)
	sc.truth("A's client got turn_finished", "yes", fmt.Sprint(ok), ok)
	_, okCross := streamEnd(cross, 60*time.Second)
	sc.truth("B's client of the turn got turn_finished", "yes", fmt.Sprint(okCross), okCross)
	rec, evs, _ := d.ended(fA.turnID, 60*time.Second)
	sc.within("database back to the stored end", time.Since(back), 15*time.Second)
	sc.count("healthy turns interrupted", interrupted(rec), 0)
	if rec != nil {
		sc.records(fA.log.snapshot(), rec, evs)
		lostX, twiceX := missing(fA.log.snapshot(), cross.log.snapshot())
		sc.count("events lost in the stream through B", lostX, 0)
		sc.count("events twice in the stream through B", twiceX, 0)
	}
	stopGateways(t, gwA, gwB)
	sc.allDead(pids)
	sc.nothingLeft(gwA.pid(), gwB.pid())
}

// hangTurnAgent is an agent with a turn budget of 5 s whose model calls a
// tool that hangs.
func hangTurnAgent(t *testing.T) agentDir {
	t.Helper()
	return newAgent(t, scriptAgent("turn: 5s, kill_grace: 500ms", "", "{name: hang, description: Hangs., exec: [./hang.sh], timeout: 10m}"),
		[]string{callTools("hang"), `{"text": "never"}`}, map[string]string{"hang.sh": hangTool})
}

// lockedStore is the body of the two lock scenarios: a turn with a 5 s
// budget whose tool hangs runs while lock holds the store's write path
// for 20 s. The tools are killed on time, the client gets turn_finished
// on time with the turn's wall_ms, /healthz says the store is behind, and
// the turn's end is stored once the lock is let go.
func lockedStore(t *testing.T, sc *scenario, gw *proc, url string, a agentDir, lock func() (release func()), storedEnd func(id string) (*event.Turn, []event.Event)) {
	t.Helper()
	posted := time.Now()
	f := postTurn(t, url, `{"input": "go"}`)
	pids := waitTool(t, a, gw)
	release := lock()
	locked := time.Now()
	end, ok := streamEnd(f, 20*time.Second)
	sc.truth("turn_finished streamed while the store is locked", "yes", fmt.Sprint(ok), ok)
	if ok {
		sc.within("post to turn_finished (turn budget 5 s)", time.Since(posted), 8*time.Second)
		sc.is("stop reason", string(end.StopReason), string(budget.TurnTimeout))
		sc.within("its wall_ms", time.Duration(end.Totals.WallMS)*time.Millisecond, 7*time.Second)
	}
	sc.allDead(pids)
	// The turn's last events wait for the lock: the store is behind once
	// a commit has waited 2 s.
	code, body := 0, ""
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if code, body = health(url); code == http.StatusServiceUnavailable {
			break
		}
	}
	sc.truth("/healthz while the store is locked", "503 store_behind", fmt.Sprintf("%d %.60s", code, body),
		code == http.StatusServiceUnavailable && strings.Contains(body, "store_behind"))
	if rest := time.Until(locked.Add(20 * time.Second)); rest > 0 {
		time.Sleep(rest)
	}
	release()
	unlocked := time.Now()
	sc.truth("/healthz 200 again", "within 10 s", "", healthyAgain(url, 10*time.Second))
	rec, evs := storedEnd(f.turnID)
	sc.within("lock released to the stored end", time.Since(unlocked), 10*time.Second)
	if rec != nil {
		sc.records(f.log.snapshot(), rec, evs)
		if end != nil {
			sc.truth("stored wall_ms: the turn's, not the store's", "= turn_finished's",
				fmt.Sprintf("%d, turn_finished %d", rec.WallMS, end.Totals.WallMS), rec.WallMS == end.Totals.WallMS)
		}
	}
}

// tableLocked: the events table is locked (ACCESS EXCLUSIVE) for 20 s
// while a turn with a 5 s budget runs.
func tableLocked(t *testing.T) {
	sc := begin(t, "events table locked 20 s, turn budget 5 s", "timebox serve, --db postgres://, an SSE client")
	d := newSharedDB(t)
	a := hangTurnAgent(t)
	gw, url := startServe(t, a, []string{"PIDFILE=" + a.pidfile}, "--db", d.dsn)
	lockedStore(t, sc, gw, url, a, func() func() {
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, d.url)
		if err != nil {
			t.Fatal(err)
		}
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `LOCK TABLE events IN ACCESS EXCLUSIVE MODE`); err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := tx.Commit(ctx); err != nil {
				t.Error(err)
			}
			conn.Close(ctx)
		}
	}, func(id string) (*event.Turn, []event.Event) {
		rec, evs, _ := d.ended(id, 60*time.Second)
		return rec, evs
	})
	stopGateways(t, gw)
	sc.nothingLeft(gw.pid())
}

// fileLocked: another process holds the SQLite file's write lock (BEGIN
// EXCLUSIVE) for 20 s while a turn with a 5 s budget runs.
func fileLocked(t *testing.T) {
	sc := begin(t, "SQLite file locked 20 s, turn budget 5 s", "timebox serve, --db FILE, an SSE client")
	a := hangTurnAgent(t)
	gw, url := startServe(t, a, []string{"PIDFILE=" + a.pidfile})
	lockedStore(t, sc, gw, url, a, func() func() {
		ctx := context.Background()
		db, err := sql.Open("sqlite", a.db)
		if err != nil {
			t.Fatal(err)
		}
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
			t.Fatal(err)
		}
		return func() {
			if _, err := conn.ExecContext(ctx, "COMMIT"); err != nil {
				t.Error(err)
			}
			conn.Close()
			db.Close()
		}
	}, func(id string) (*event.Turn, []event.Event) {
		for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if r, err := turnRecord(url, id); err == nil && r.Status != budget.StatusRunning {
				break
			}
		}
		stopGateways(t, gw)
		return stored(t, a.db, id)
	})
	sc.nothingLeft(gw.pid())
}

// fillTool fills the disk $FILL is on, then returns 1 MiB: more than a
// full disk can store.
const fillTool = `#!/usr/bin/env bash
cat >/dev/null
dd if=/dev/zero of="$FILL" bs=64k 2>/dev/null
head -c 1048576 /dev/zero | tr '\0' x
`

// freeTool makes room on that disk again.
const freeTool = `#!/usr/bin/env bash
cat >/dev/null
rm -f "$FILL"
echo freed
`

// diskFullThenRoom: the disk holding a SQLite store (a tmpfs of its own)
// fills up mid-turn, its first tool's doing, and has room again after the
// second. The events the full disk refused are stored by the turn's end,
// with their call records, though events after them were stored before
// it (docs/decisions/end-writes-what-changed.md).
func diskFullThenRoom(t *testing.T) {
	sc := begin(t, "SQLite's disk full mid-turn, then room again", "timebox run --json, --db on a 16 MiB tmpfs")
	a := newAgent(t, scriptAgent("", "", "{name: fill, description: Fills the disk., exec: [./fill.sh]}",
		"{name: free, description: Frees the disk., exec: [./free.sh]}"),
		[]string{callTools("fill"), callTools("free"), `{"text": "done"}`},
		map[string]string{"fill.sh": fillTool, "free.sh": freeTool})
	disk := smallDisk(t, a.dir)
	db := filepath.Join(disk, "timebox.db")
	p := startTimebox(t, a.dir, []string{"FILL=" + filepath.Join(disk, "filler")}, nil, "run", "-f", a.file, "--db", db, "--json", "go")
	code := p.wait(60 * time.Second)
	t.Logf("exit %d\n%s", code, p.stderr.String())
	said := p.stderr.String()
	full := strings.Contains(said, "disk holding the store is full") && strings.Contains(said, "its end stored them")
	sc.truth("timebox said the disk was full, and that the turn's end stored what it refused", "yes", fmt.Sprint(full), full)
	sc.nothingLeft(p.pid())
	st, evs := stored(t, db, "")
	seen := p.log.snapshot()
	if fin := finished(seen); fin != nil {
		sc.is("stop reason", string(fin.StopReason), string(budget.Answered))
	}
	sc.records(seen, st, evs)
}

// smallDisk mounts a 16 MiB tmpfs of the test's own in dir and returns
// its path; it skips the test where it cannot (mounting needs root).
func smallDisk(t *testing.T, dir string) string {
	t.Helper()
	disk := filepath.Join(dir, "disk")
	if err := os.Mkdir(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", disk, "tmpfs", 0, "size=16m"); err != nil {
		t.Skipf("a disk to fill is a tmpfs of the test's own: %v (mounting it needs root)", err)
	}
	t.Cleanup(func() { syscall.Unmount(disk, syscall.MNT_DETACH) })
	return disk
}

// holdTool waits until the file $GO exists, a minute at most.
const holdTool = `#!/usr/bin/env bash
cat >/dev/null
for _ in $(seq 600); do [ -e "$GO" ] && break; sleep 0.1; done
echo held
`

// diskFullUnderServe: the same disk under `timebox serve`. A client
// follows the turn from its first event (GET …/events?after=0) once the
// full disk has refused events and, with room again, the store has the
// events after them: it must get the refused events from the gateway, in
// their places, and the turn's end must store them
// (docs/decisions/store-outages.md).
func diskFullUnderServe(t *testing.T) {
	sc := begin(t, "SQLite's disk full under serve, a client joins mid-turn", "timebox serve, --db on a 16 MiB tmpfs, two SSE clients")
	a := newAgent(t, scriptAgent("", "", "{name: fill, description: Fills the disk., exec: [./fill.sh]}",
		"{name: free, description: Frees the disk., exec: [./free.sh]}",
		"{name: hold, description: Waits., exec: [./hold.sh], timeout: 2m}"),
		[]string{callTools("fill"), callTools("free"), callTools("hold"), `{"text": "done"}`},
		map[string]string{"fill.sh": fillTool, "free.sh": freeTool, "hold.sh": holdTool})
	disk := smallDisk(t, a.dir)
	a.db = filepath.Join(disk, "timebox.db")
	goFile := filepath.Join(a.dir, "go")
	gw, url := startServe(t, a, []string{"FILL=" + filepath.Join(disk, "filler"), "GO=" + goFile})
	f := postTurn(t, url, `{"input": "go"}`)
	held := toolStarted(f.log, "hold", 60*time.Second)
	var joined *follower
	if held {
		joined = replayTurn(t, url, f.turnID)
		held = toolStarted(joined.log, "hold", 30*time.Second)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, ok := streamEnd(f, 60*time.Second)
	okJ := false
	if joined != nil {
		_, okJ = streamEnd(joined, 60*time.Second)
	}
	sc.truth("both clients got turn_finished, the second joined while the last tool ran", "yes", fmt.Sprint(ok && okJ && held), ok && okJ && held)
	seen := f.log.snapshot()
	if joined != nil {
		lost, twice := missing(seen, joined.log.snapshot())
		sc.count("events the client that joined missed", lost, 0)
		sc.count("events it got twice", twice, 0)
	}
	wait.Until(30*time.Second, func() bool {
		r, err := turnRecord(url, f.turnID)
		return err == nil && r.Status != budget.StatusRunning
	})
	stopGateways(t, gw)
	sc.logSays(gw, "serve logged the refused events, then that the turn's end stored them",
		"store write failed", "the turn's end stored the events the store refused")
	st, evs := stored(t, a.db, f.turnID)
	sc.records(seen, st, evs)
	sc.nothingLeft(gw.pid())
}

// diskFullThenSuspended: the full disk refuses events of a turn under
// serve; with room again, the turn's next call waits for a person, and
// serve stops (SIGTERM), suspending the turn. Its end, in the next serve,
// knows only the events after the checkpoint, so the suspension must store
// the refused ones; the turn must end with every event stored, no seq
// missing (docs/decisions/store-outages.md).
func diskFullThenSuspended(t *testing.T) {
	sc := begin(t, "SQLite's disk full, then serve restarted while a call waits for a person", "timebox serve ×2 in turn, --db on a 16 MiB tmpfs, SIGTERM while a call waits")
	a := newAgent(t, scriptAgent("", "", "{name: fill, description: Fills the disk., exec: [./fill.sh]}",
		"{name: free, description: Frees the disk., exec: [./free.sh]}",
		"{name: deploy, exec: [./deploy.sh], approval: required, timeout: 5s}"),
		[]string{callTools("fill"), callTools("free"), `{"tool_calls": [{"name": "deploy", "arguments": {"env": "prod"}}]}`, `{"text": "deployed"}`},
		map[string]string{"fill.sh": fillTool, "free.sh": freeTool, "deploy.sh": "#!/bin/sh\ncat >/dev/null\necho run >> runs\necho deployed\n"})
	disk := smallDisk(t, a.dir)
	a.db = filepath.Join(disk, "timebox.db")
	recv := testenv.NewOTLP(t)
	gw, url := startServe(t, a, append([]string{"FILL=" + filepath.Join(disk, "filler")}, traced(recv)...))
	turnID, callID := waitingCall(t, url, `{"input": "go", "detach": true}`)
	stopGateways(t, gw)
	sc.logSays(gw, "serve logged the refused events, then that the suspension stored them",
		"store write failed", "the turn's suspension stored the events the store refused")

	gw2, url2 := startServe(t, a, traced(recv))
	resp, err := http.Post(url2+"/v1/turns/"+turnID+"/approvals/"+callID, "application/json", strings.NewReader(`{"decision": "approve", "by": "faults"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	sc.count("decision through the new serve (HTTP status)", resp.StatusCode, http.StatusOK)
	ended := wait.Until(30*time.Second, func() bool {
		r, err := turnRecord(url2, turnID)
		return err == nil && r.Status != budget.StatusRunning
	})
	sc.truth("the turn ended after the decision", "yes", fmt.Sprint(ended), ended)
	stopGateways(t, gw2)
	st, evs := stored(t, a.db, turnID)
	sc.is("turn status", string(st.Status), string(budget.StatusCompleted))
	missingSeqs := 0 // the store holds each seq once, in order
	if n := len(evs); n > 0 {
		missingSeqs = int(evs[n-1].Seq) - n
	}
	sc.count("events missing from the store across the suspension", missingSeqs, 0)
	sc.count("times the approved call ran", ranTimes(a), 1)
	sc.traceWhole(recv, "", turnID)
	sc.nothingLeft(gw.pid(), gw2.pid())
}

// logSays is the figure what: whether p's standard error holds each of
// says. The log is shown when it does not.
func (sc *scenario) logSays(p *proc, what string, says ...string) {
	log := p.stderr.String()
	ok := true
	for _, s := range says {
		ok = ok && strings.Contains(log, s)
	}
	sc.truth(what, "yes", fmt.Sprint(ok), ok)
	if !ok {
		sc.t.Logf("the log:\n%s", log)
	}
}

// toolStarted waits up to d for log's tool_started of the tool name.
func toolStarted(log *eventLog, name string, d time.Duration) bool {
	return wait.Until(d, func() bool {
		for _, e := range log.snapshot() {
			if ts, ok := e.Data.(*event.ToolStarted); ok && ts.Tool == name {
				return true
			}
		}
		return false
	})
}

// killConnections terminates every connection to the database but its
// own every interval until stop is closed, and returns how many it
// killed.
func killConnections(t *testing.T, dsn string, every time.Duration, stop <-chan struct{}) *atomic.Int64 {
	t.Helper()
	var killed atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			conn, err := pgx.Connect(ctx, dsn)
			if err == nil {
				var n int64
				if err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
					WHERE datname = current_database() AND pid <> pg_backend_pid()`).Scan(&n); err == nil {
					killed.Add(n)
				}
				conn.Close(ctx)
			}
			cancel()
		}
	})
	t.Cleanup(wg.Wait)
	return &killed
}

// connectionsKilled: every connection of the gateways is killed
// (pg_terminate_backend) every 250 ms while two turns run and a client
// follows one through the other gateway.
func connectionsKilled(t *testing.T) {
	sc := begin(t, "connections killed every 250 ms (pg_terminate_backend)", "timebox serve ×2, --db postgres://, SSE clients")
	d := newSharedDB(t)
	a := workAgent(t, "")
	gwA, urlA := d.gateway(a, 8)
	gwB, urlB := d.gateway(a, 8)
	fA := postTurn(t, urlA, `{"input": "go"}`)
	fB := postTurn(t, urlB, `{"input": "go"}`)
	pids := a.waitPIDs(t, 2, gwA)
	cross := replayTurn(t, urlB, fA.turnID)
	stop := make(chan struct{})
	killed := killConnections(t, d.url, 250*time.Millisecond, stop)
	_, okA := streamEnd(fA, 60*time.Second)
	_, okB := streamEnd(fB, 60*time.Second)
	_, okX := streamEnd(cross, 60*time.Second)
	close(stop)
	stoppedKilling := time.Now()
	sc.truth("every client got turn_finished", "yes", fmt.Sprint(okA && okB && okX), okA && okB && okX)
	recA, evsA, _ := d.ended(fA.turnID, 60*time.Second)
	recB, evsB, _ := d.ended(fB.turnID, 60*time.Second)
	sc.within("last kill to the stored ends", time.Since(stoppedKilling), 10*time.Second)
	sc.truth("connections killed", "> 0", fmt.Sprint(killed.Load()), killed.Load() > 0)
	sc.count("healthy turns interrupted", interrupted(recA, recB), 0)
	if recA != nil && recB != nil {
		lostA, _ := missing(fA.log.snapshot(), evsA)
		lostB, _ := missing(fB.log.snapshot(), evsB)
		lostX, twiceX := missing(fA.log.snapshot(), cross.log.snapshot())
		sc.count("events lost (A's, B's, of the stream through B)", lostA+lostB+lostX, 0)
		sc.count("events twice in the stream through B", twiceX, 0)
		sc.records(fA.log.snapshot(), recA, evsA)
	}
	stopGateways(t, gwA, gwB)
	sc.allDead(pids)
	sc.nothingLeft(gwA.pid(), gwB.pid())
}

// twoWritersNumber: two stores number the events of one turn (as the
// workers of an engine do) while every connection is killed every 100 ms:
// each event is stored once, the seqs have no gap, each writer's events
// keep its order.
func twoWritersNumber(t *testing.T) {
	sc := begin(t, "two writers number one turn's events while commits fail", "postgres.Store ×2 in the test, connections killed every 100 ms")
	d := newSharedDB(t)
	ctx := context.Background()
	if err := d.st.BeginTurn(ctx, store.TurnStart{TurnID: "t1", Input: "go", Engine: "test"}); err != nil {
		t.Fatal(err)
	}
	var writers []*postgres.Store
	for range 2 {
		w, err := postgres.Open(ctx, d.dsn, postgres.Options{})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close()
		writers = append(writers, w)
	}
	stop := make(chan struct{})
	killed := killConnections(t, d.url, 100*time.Millisecond, stop)
	const each = 2000
	var failed atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for n, w := range writers {
		wg.Go(func() {
			for i := range each {
				w.QueueEvent(event.Event{TurnID: "t1", Type: event.TypeStillWorking, At: time.Now(),
					Data: &event.StillWorking{Subject: fmt.Sprintf("w%d", n), ElapsedMS: int64(i)}}, func(err error) {
					if err != nil {
						failed.Add(1)
						t.Log(err)
					}
				})
				if i%100 == 99 {
					time.Sleep(100 * time.Millisecond) // 4 s of writing, in bursts
				}
			}
			for w.Flush(ctx) != nil {
			}
		})
	}
	wg.Wait()
	close(stop)
	took := time.Since(start)
	evs, err := d.st.Events(ctx, "t1", 0, 0)
	for err != nil { // the test's store met the kills too
		time.Sleep(100 * time.Millisecond)
		evs, err = d.st.Events(ctx, "t1", 0, 0)
	}
	got := map[string]int{}
	var seqs []int64
	order := map[string]int64{"w0": -1, "w1": -1}
	outOfOrder := 0
	for _, e := range evs {
		s := e.Data.(*event.StillWorking)
		got[fmt.Sprintf("%s/%d", s.Subject, s.ElapsedMS)]++
		seqs = append(seqs, e.Seq)
		if s.ElapsedMS <= order[s.Subject] {
			outOfOrder++
		}
		order[s.Subject] = s.ElapsedMS
	}
	lost, twice := 0, 0
	for n := range 2 {
		for i := range each {
			switch c := got[fmt.Sprintf("w%d/%d", n, i)]; {
			case c == 0:
				lost++
			case c > 1:
				twice += c - 1
			}
		}
	}
	gaps := 0
	for i, s := range slices.Sorted(slices.Values(seqs)) {
		if s != int64(i+1) {
			gaps++
		}
	}
	sc.truth("connections killed", "> 0", fmt.Sprint(killed.Load()), killed.Load() > 0)
	sc.count("writes that failed", int(failed.Load()), 0)
	sc.addKind(kindLost, "events lost", "= 0", fmt.Sprint(lost), lost == 0)
	sc.count("events stored twice", twice, 0)
	sc.count("seqs out of place (gaps, duplicates)", gaps, 0)
	sc.count("a writer's events out of its order", outOfOrder, 0)
	sc.within(fmt.Sprintf("%d events written", 2*each), took, 60*time.Second)
}

// shutdownDuringOutage: PostgreSQL is stopped mid-turn; the turn ends
// during the outage (its client gets turn_finished), then its gateway gets
// SIGTERM, and the database comes back 33 s later: past the 30 s serve
// waits for running turns to store their ends, within the store's own
// 30 s close after it. The turn's end is stored as it ended: answered, one
// turn_finished, its session's conversation kept. (Before 2026-11-28 the
// closing store refused the end that waited for it, stored the queued
// turn_finished, then marked the turn interrupted, with a second
// turn_finished and no conversation.)
func shutdownDuringOutage(t *testing.T) {
	sc := begin(t, "SIGTERM to serve during a PostgreSQL outage, a turn's end waiting", "timebox serve --shutdown-grace 0, --db postgres://…, an SSE client")
	d := newSharedDB(t)
	a := workAgent(t, "")
	// --shutdown-grace 0: serve waits 30 s for the turns' ends, no more.
	gw, url := startServe(t, a, []string{"PIDFILE=" + a.pidfile, "WORK_SECONDS=2"}, "--db", d.dsn, "--shutdown-grace", "0")
	f := postTurn(t, url, `{"input": "go", "session_id": "outage-shutdown"}`)
	pids := a.waitPIDs(t, 1, gw)
	d.pg.Stop()
	_, ok := streamEnd(f, 20*time.Second)
	sc.truth("the client got turn_finished while the database was down", "yes", fmt.Sprint(ok), ok)
	gw.cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(33 * time.Second)
	d.pg.Start()
	code := gw.wait(60 * time.Second)
	// 1: serve says a turn did not end within its 30 s (it had not).
	sc.truth("serve exited", "once the end was stored", fmt.Sprintf("exit code %d", code), code >= 0)
	rec, evs, _ := d.ended(f.turnID, 30*time.Second)
	if rec == nil {
		t.Fatalf("no record\n%s", gw.stderr.String())
	}
	sc.is("stored status", fmt.Sprintf("%s/%s", rec.Status, rec.StopReason), "completed/answered")
	sc.count("turn_finished events stored", countType(evs, event.TypeTurnFinished), 1)
	lost, twice := missing(f.log.snapshot(), evs)
	sc.count("events lost or stored twice", lost+twice, 0)
	sess, err := d.st.Session(context.Background(), "outage-shutdown")
	n := 0
	if err == nil {
		n = len(sess.Messages)
	}
	sc.truth("the session's conversation stored", "the question and the answer", fmt.Sprintf("%d messages (%v)", n, err), n >= 2)
	sc.allDead(pids)
	sc.nothingLeft(gw.pid())
}
