package temporal_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

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
	st   store.Store
	stop func()
}

// startGateway serves a gateway of agent name on queue, with a store of
// its own on dsn, looking for turns to adopt every adopt.
func startGateway(t *testing.T, c client.Client, dsn, queue, name string, a *agent.Agent, adopt time.Duration) *gateway {
	t.Helper()
	st, err := postgres.Open(context.Background(), dsn, postgres.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r, err := temporal.NewRunner(c, st, queue, a)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := server.New(server.Config{Agent: r, AgentName: name, Store: st, AdoptInterval: adopt})
	if err != nil {
		t.Fatal(err)
	}
	url, stop := testenv.Serve(t, srv.Serve)
	// Stopped, it stops following its turns and closes its store: its
	// owner row goes with it, and the others may adopt its turns. What
	// Serve returned fails the test when it ends (testenv.Serve).
	g := &gateway{url: url, st: st, stop: sync.OnceFunc(func() {
		stop()
		st.Close()
	})}
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
	id := postJSON[server.TurnAccepted](t, ga.url+"/v1/turns", map[string]any{"input": "go", "detach": true}, http.StatusAccepted).TurnID
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
