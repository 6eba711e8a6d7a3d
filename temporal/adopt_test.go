package temporal_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/temporal"
)

// gateway is a `serve --engine temporal` in the test: a server with its
// own store, so that the others take it for gone once it stops.
type gateway struct {
	url  string
	st   *postgres.Store
	srv  *server.Server
	stop func()
	// looks counts its looks for turns to adopt, done.
	looks atomic.Int64
}

// looking is a gateway's store, which counts its looks for turns to adopt.
type looking struct {
	*postgres.Store
	g *gateway
}

func (l looking) AdoptTurns(ctx context.Context, engine, agent string, limit int) ([]string, error) {
	defer l.g.looks.Add(1)
	return l.Store.AdoptTurns(ctx, engine, agent, limit)
}

// startGateway serves a gateway of agent name on queue, with a store of
// its own on dsn, looking for turns to adopt every adopt.
func startGateway(t *testing.T, c client.Client, dsn, queue, name string, a *agent.Agent, adopt time.Duration) *gateway {
	t.Helper()
	return startGatewayWith(t, c, dsn, postgres.Options{}, queue, name, a, adopt)
}

// startGatewayWith is startGateway, with a store opened with o.
func startGatewayWith(t *testing.T, c client.Client, dsn string, o postgres.Options, queue, name string, a *agent.Agent, adopt time.Duration) *gateway {
	t.Helper()
	st, err := postgres.Open(context.Background(), dsn, o)
	if err != nil {
		t.Fatal(err)
	}
	g := &gateway{st: st}
	r, err := temporal.NewRunner(c, looking{st, g}, queue, a)
	if err != nil {
		t.Fatal(err)
	}
	g.srv, err = server.New(server.Config{Agent: r, AgentName: name, Store: looking{st, g}, AdoptInterval: adopt})
	if err != nil {
		t.Fatal(err)
	}
	url, stop := testenv.Serve(t, g.srv.Serve)
	g.url = url
	// Stopped, it stops following its turns and closes its store: its
	// owner row goes with it, and the others may adopt its turns. What
	// Serve returned fails the test when it ends (testenv.Serve).
	g.stop = sync.OnceFunc(func() {
		stop()
		st.Close()
	})
	t.Cleanup(g.stop)
	return g
}

// postJSON posts body (as JSON; nil for none) to url and returns the
// answer decoded, failing t unless its status is want.
func postJSON[T any](t *testing.T, url string, body any, want int) T {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		r = bytes.NewReader(b)
	}
	resp, err := http.Post(url, "application/json", r)
	if err != nil {
		t.Fatal(err)
	}
	var got T
	err = json.NewDecoder(resp.Body).Decode(&got)
	resp.Body.Close()
	if err != nil || resp.StatusCode != want {
		t.Fatalf("POST %s: HTTP %d (%v)", url, resp.StatusCode, err)
	}
	return got
}

// postDetached begins a detached turn through the gateway at url and
// returns its id.
func postDetached(t *testing.T, url string) string {
	t.Helper()
	return postJSON[server.TurnAccepted](t, url+"/v1/turns", map[string]any{"input": "go", "detach": true}, http.StatusAccepted).TurnID
}

// waitNotices returns the notices of turn id that its work waits for a
// worker.
func waitNotices(t *testing.T, s store.Store, id string) []*event.StillWorking {
	t.Helper()
	evs, err := s.Events(context.Background(), id, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []*event.StillWorking
	for _, e := range evs {
		if n, _ := e.Data.(*event.StillWorking); n != nil && n.Waiting != "" {
			out = append(out, n)
		}
	}
	return out
}

// TestAdoptedTurnEndsAtCeiling: a detached turn's gateway stops (its
// follower is gone), then its only worker stops mid-tool, and its ceiling
// (12s) falls with no worker to enforce it. A second gateway adopts the
// turn, says it waits for a worker, and stops following it in turn (shut
// down); a third adopts it, does not say so again, and ends it at its
// ceiling as the turn's own follower would have — stopped, turn_timeout,
// the embedded engine's message and flags, saying that no worker ran it —
// and terminates its workflow. (Before, the turn stayed running until a
// worker came: nobody followed it.)
func TestAdoptedTurnEndsAtCeiling(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	const ceiling = 12 * time.Second
	c, s, queue, dsn := setupDSN(t)
	defer func(w, g time.Duration) { temporal.WorkerWait, temporal.CeilingGrace = w, g }(temporal.WorkerWait, temporal.CeilingGrace)
	temporal.WorkerWait, temporal.CeilingGrace = 2*time.Second, time.Second
	a := openAgent(t, stopAgent(t, ceiling.String())).Agent
	ws, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	w := runningWorker(t, c, queue, a, ws)
	defer w.Stop()

	ga := startGateway(t, c, dsn, queue, "stops", a, -1)
	id := postDetached(t, ga.url)
	has := func(typ event.Type, ok func(event.Event) bool) int {
		evs, _ := s.Events(context.Background(), id, 0, 0)
		n := 0
		for _, e := range evs {
			if e.Type == typ && (ok == nil || ok(e)) {
				n++
			}
		}
		return n
	}
	waiting := func(e event.Event) bool { n, _ := e.Data.(*event.StillWorking); return n != nil && n.Waiting != "" }
	wait.For(t, 30*time.Second, "the tool's start", func() bool { return has(event.TypeToolStarted, nil) > 0 })

	// The gateway stops following the turn, and the worker dies: its
	// store closed first, as a killed worker's, so that it stores nothing
	// more of the turn.
	ga.stop()
	ws.Close()
	w.Stop()

	gb := startGateway(t, c, dsn, queue, "stops", a, 200*time.Millisecond)
	wait.For(t, 20*time.Second, "the adopter's notice that no worker takes the turn", func() bool { return has(event.TypeStillWorking, waiting) > 0 })
	gb.stop()
	startGateway(t, c, dsn, queue, "stops", a, 200*time.Millisecond)
	var rec *event.Turn
	wait.For(t, ceiling+30*time.Second, "the turn's end", func() bool {
		rec, err = s.Turn(context.Background(), id)
		return err == nil && rec.Status != budget.StatusRunning
	})

	checkCeilingEnd(t, rec, ceiling, queue)
	evs, err := s.Events(context.Background(), id, 0, 0)
	if err != nil || len(evs) == 0 {
		t.Fatalf("the turn's events: %v", err)
	}
	if fin, ok := evs[len(evs)-1].Data.(*event.TurnFinished); !ok || fin.Limit == nil || fin.Limit.Key != budget.KeyTurn {
		t.Errorf("the last event %+v, want turn_finished with timeouts.turn its limit", evs[len(evs)-1].Data)
	}
	if c := callNamed(t, rec, "long"); c.Outcome != event.OutcomeInterrupted {
		t.Errorf("the running call ended %s, want interrupted", c.Outcome)
	}
	if n := has(event.TypeStillWorking, waiting); n != 1 {
		t.Errorf("%d notices that no worker takes the turn, want 1: its second adopter said it again", n)
	}
	desc, err := c.DescribeWorkflowExecution(context.Background(), temporal.WorkflowID(id), "")
	if err != nil {
		t.Fatal(err)
	}
	if st := desc.WorkflowExecutionInfo.Status.String(); st != "Terminated" {
		t.Errorf("the workflow is %s, want Terminated", st)
	}
}

// TestAdoptionKeepsToItsQueue: gateways of one agent's name on two task
// queues share the database. A detached turn of the first queue whose
// gateway stopped is adopted by a gateway of its queue, never by one of
// the other, which looked first — it would follow a turn its workers do
// not run, and say that none takes it on the wrong queue. The adopter's
// notice names the turn's queue.
func TestAdoptionKeepsToItsQueue(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	ctx := context.Background()
	c, s, queue, dsn := setupDSN(t)
	defer func(w time.Duration) { temporal.WorkerWait = w }(temporal.WorkerWait)
	temporal.WorkerWait = time.Second
	a := openAgent(t, stopAgent(t, "1m")).Agent

	ga := startGateway(t, c, dsn, queue, "shared", a, -1)
	id := postDetached(t, ga.url)
	defer c.TerminateWorkflow(ctx, temporal.WorkflowID(id), "", "the test ended")
	ga.stop()
	gb := startGateway(t, c, dsn, queue+"-other", "shared", a, 50*time.Millisecond)
	wait.For(t, 10*time.Second, "two looks of the other queue's gateway", func() bool { return gb.looks.Load() >= 2 })
	gc := startGateway(t, c, dsn, queue, "shared", a, 50*time.Millisecond)
	fs := s.(store.Followers)
	wait.For(t, 20*time.Second, "the adoption by a gateway of the turn's queue", func() bool {
		who, err := fs.Follower(ctx, id)
		return err == nil && who == gc.st.Owner()
	})
	wait.For(t, 20*time.Second, "the adopter's notice that no worker takes the turn", func() bool { return len(waitNotices(t, s, id)) > 0 })
	for _, n := range waitNotices(t, s, id) {
		if !strings.Contains(n.Waiting, strconv.Quote(queue)) {
			t.Errorf("the notice %q names another queue than the turn's, %q", n.Waiting, queue)
		}
	}
}

// TestFollowerTakenForGoneStopsFollowing: a gateway paused long enough to
// be taken for gone (the store that judged it deleted its owner row, as
// PostgreSQL's recover does) has its detached turn adopted by another.
// Back — its store registered again — it finds at its next look at the
// turn that its follower is the adopter, and stops following it, as at a
// shutdown; it does not adopt it back. The adopter alone says the turn
// waits for a worker, once. (Before, it followed on beside the adopter.)
func TestFollowerTakenForGoneStopsFollowing(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	ctx := context.Background()
	c, s, queue, dsn := setupDSN(t)
	defer func(w time.Duration) { temporal.WorkerWait = w }(temporal.WorkerWait)
	temporal.WorkerWait = 8 * time.Second
	a := openAgent(t, stopAgent(t, "1m")).Agent
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)

	paused := startGatewayWith(t, c, dsn, postgres.Options{Heartbeat: time.Second}, queue, "paused", a, 100*time.Millisecond)
	id := postDetached(t, paused.url)
	defer c.TerminateWorkflow(ctx, temporal.WorkflowID(id), "", "the test ended")
	adopter := startGateway(t, c, dsn, queue, "paused", a, 50*time.Millisecond)
	fs := s.(store.Followers)
	wait.For(t, 20*time.Second, "the adoption of the paused gateway's turn", func() bool {
		// Taken for gone, again until the adopter has looked: its own
		// heartbeat registers it again within a second.
		if _, err := conn.Exec(ctx, `DELETE FROM owners WHERE owner_id = $1`, paused.st.Owner()); err != nil {
			t.Fatal(err)
		}
		who, err := fs.Follower(ctx, id)
		return err == nil && who == adopter.st.Owner()
	})
	wait.For(t, 10*time.Second, "the paused gateway's store registered again", func() bool {
		var n int
		return conn.QueryRow(ctx, `SELECT count(*) FROM owners WHERE owner_id = $1`, paused.st.Owner()).Scan(&n) == nil && n == 1
	})
	wait.For(t, 10*time.Second, "the paused gateway to stop following the turn", func() bool { return paused.srv.Running() == 0 })
	looked := paused.looks.Load()
	wait.For(t, 10*time.Second, "two looks of the paused gateway since", func() bool { return paused.looks.Load() >= looked+2 })
	if who, err := fs.Follower(ctx, id); err != nil || who != adopter.st.Owner() || paused.srv.Running() != 0 {
		t.Fatalf("the turn's follower is %q (%v), the paused gateway follows %d turns: want the adopter, and none", who, err, paused.srv.Running())
	}
	wait.For(t, 30*time.Second, "the adopter's notice that no worker takes the turn", func() bool { return len(waitNotices(t, s, id)) > 0 })
	if n := len(waitNotices(t, s, id)); n != 1 {
		t.Errorf("%d notices that no worker takes the turn, want 1", n)
	}
}

// describing is a Temporal client that counts the checks of workflows.
type describing struct {
	client.Client
	n atomic.Int64
}

func (d *describing) DescribeWorkflowExecution(ctx context.Context, id, run string) (*workflowservice.DescribeWorkflowExecutionResponse, error) {
	d.n.Add(1)
	return d.Client.DescribeWorkflowExecution(ctx, id, run)
}

// TestEngineChecksArePaced: a runner following many turns — a gateway
// that adopted thousands of orphans — checks their engine at most
// EngineChecksPerSecond times a second over all of them, not each every
// EngineCheck. Here 8 turns no worker takes, checked every 100ms, at most
// 5 a second: 20 checks take about 4s (without the bound, 8 turns take
// 0.3s).
func TestEngineChecksArePaced(t *testing.T) {
	defer proctest.CheckNoLeaks(t)
	defer func(c time.Duration, n int) { temporal.EngineCheck, temporal.EngineChecksPerSecond = c, n }(temporal.EngineCheck, temporal.EngineChecksPerSecond)
	temporal.EngineCheck, temporal.EngineChecksPerSecond = 100*time.Millisecond, 5
	c, s, queue := setup(t)
	dc := &describing{Client: c}
	r, err := temporal.NewRunner(dc, s, queue, openAgent(t, stopAgent(t, "1m")).Agent)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancelCause(context.Background())
	var runs sync.WaitGroup
	for i := range 8 {
		id := "t_paced" + strconv.Itoa(i)
		runs.Go(func() { r.Run(ctx, agent.Input{TurnID: id, Text: "go"}) })
		defer c.TerminateWorkflow(context.Background(), temporal.WorkflowID(id), "", "the test ended")
	}
	wait.For(t, 30*time.Second, "the first check", func() bool { return dc.n.Load() > 0 })
	start, from := time.Now(), dc.n.Load()
	wait.For(t, 30*time.Second, "20 checks more", func() bool { return dc.n.Load() >= from+20 })
	took := time.Since(start)
	stop(agent.ErrStopFollowing)
	runs.Wait()
	t.Logf("20 checks of 8 turns took %v", took.Round(time.Millisecond))
	// 5 a second, each reserved ahead: 20 take 3.8s at least.
	if took < 3*time.Second {
		t.Errorf("20 checks of 8 turns took %v, want about 4s at 5 a second", took)
	}
}
