package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
)

// engineRunner stands in for package temporal's Runner: its turns are
// stored by "workers" (here, the runner itself, straight into the store)
// and their events then reach the server's sinks from the store.
type engineRunner struct {
	a  *agent.Agent
	st store.Store
}

func (engineRunner) Engine() string { return "fake" }

func (r engineRunner) Run(ctx context.Context, in agent.Input, sinks ...event.Sink) *agent.Result {
	worker := event.SinkFunc(func(e event.Event) {
		if err := r.st.AppendEvent(context.Background(), e); err != nil {
			panic(err)
		}
		for _, s := range sinks {
			s.Emit(e)
		}
	})
	res := r.a.Run(ctx, in, worker)
	if err := r.st.FinishTurn(context.Background(), res.Record, res.Messages); err != nil {
		panic(err)
	}
	return res
}

// watchedStore counts what the server itself writes of a turn.
type watchedStore struct {
	store.Store
	mu       sync.Mutex
	engines  []string
	queued   atomic.Int32
	finished atomic.Int32
}

func (w *watchedStore) BeginTurn(ctx context.Context, t store.TurnStart) error {
	w.mu.Lock()
	w.engines = append(w.engines, t.Engine)
	w.mu.Unlock()
	return w.Store.BeginTurn(ctx, t)
}

func (w *watchedStore) QueueEvent(e event.Event, committed func(error)) {
	w.queued.Add(1)
	w.Store.QueueEvent(e, committed)
}

func (w *watchedStore) AppendEvent(ctx context.Context, e event.Event) error {
	w.queued.Add(1)
	return w.Store.AppendEvent(ctx, e)
}

func (w *watchedStore) FinishTurn(ctx context.Context, rec *event.Turn, msgs []model.Message) error {
	w.finished.Add(1)
	return w.Store.FinishTurn(ctx, rec, msgs)
}

// TestEngineRunnerTurnsAreNotStoredTwice: a turn of a Runner whose engine
// stores its turns (server.EngineRunner) is begun with its engine, streamed
// and answered as any turn, and the server writes none of its events and
// not its record.
func TestEngineRunnerTurnsAreNotStoredTwice(t *testing.T) {
	base := store.NewMemory()
	ws := &watchedStore{Store: base}
	a := newAgent(t, scripted(t, `{"text": "from the engine"}`))
	e := newEnv(t, server.Config{Agent: engineRunner{a: a, st: base}, Store: ws})
	resp, sse := e.stream(t.Context(), map[string]any{"input": "go"})
	evs := sse.all(t)
	resp.Body.Close()
	checkSeqs(t, evs)
	if len(evs) == 0 || evs[len(evs)-1].typ != "turn_finished" {
		t.Fatalf("the stream did not end with turn_finished: %v", evs)
	}
	var started struct {
		TurnID string `json:"turn_id"`
	}
	if err := json.Unmarshal([]byte(evs[0].data), &started); err != nil || started.TurnID == "" {
		t.Fatalf("turn_started %s: %v", evs[0].data, err)
	}
	rec := decode[rawRecord](t, e.do("GET", "/v1/turns/"+started.TurnID, nil), http.StatusOK)
	if rec.Status != budget.StatusCompleted {
		t.Errorf("stored status %s", rec.Status)
	}
	ws.mu.Lock()
	engines := ws.engines
	ws.mu.Unlock()
	if len(engines) != 1 || engines[0] != "fake" {
		t.Errorf("the turn was begun with engines %q, want [fake]", engines)
	}
	if n, f := ws.queued.Load(), ws.finished.Load(); n != 0 || f != 0 {
		t.Errorf("the server stored %d events and %d records of the engine's turn, want none", n, f)
	}
}

// followingRunner is an engine's Runner whose turns run until the server
// stops following them: it notes why its context ended.
type followingRunner struct {
	started chan struct{}
	cause   chan error
}

func (followingRunner) Engine() string { return "fake" }

func (r followingRunner) Run(ctx context.Context, in agent.Input, sinks ...event.Sink) *agent.Result {
	close(r.started)
	<-ctx.Done()
	r.cause <- context.Cause(ctx)
	return &agent.Result{Record: &event.Turn{TurnID: in.TurnID, SessionID: in.SessionID, Status: budget.StatusRunning}}
}

// TestShutdownLeavesEngineTurnsRunning: a gateway whose turns run on an
// engine's workers stops following them when it shuts down, and does not
// cancel them (a detached Temporal turn was cancelled "shutdown", though
// it is meant to outlive its gateway).
func TestShutdownLeavesEngineTurnsRunning(t *testing.T) {
	r := followingRunner{started: make(chan struct{}), cause: make(chan error, 1)}
	e := newEnv(t, server.Config{Agent: r})
	resp := e.do(http.MethodPost, "/v1/turns", map[string]any{"input": "go", "detach": true})
	resp.Body.Close()
	<-r.started
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	if cause := <-r.cause; !errors.Is(cause, agent.ErrStopFollowing) {
		t.Errorf("the turn's Run ended by %v, want agent.ErrStopFollowing", cause)
	}
}
