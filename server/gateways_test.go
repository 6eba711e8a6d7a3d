package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
)

// TestTwoGatewaysOnePostgres: two servers on one PostgreSQL database. A
// turn started through A is followed live through B (its tool's progress
// arrives while the tool runs), a second turn in its session is refused
// through B, and a cancel sent to B reaches A, stops the tool, and both
// answer with the cancelled record.
func TestTwoGatewaysOnePostgres(t *testing.T) {
	dsn := testenv.Postgres(t)
	g := newGate("wait")
	g.every = 20 * time.Millisecond
	a := newEnv(t, server.Config{Store: openNotified(t, dsn), Agent: newAgent(t, scripted(t, waitThenAnswer...), g.tool())})
	b := newEnv(t, server.Config{Store: openNotified(t, dsn), Agent: newAgent(t, scripted(t, `{"text": "never asked"}`))})

	acc := decode[server.TurnAccepted](t, a.do("POST", "/v1/turns", map[string]any{"input": "go", "detach": true}), http.StatusAccepted)
	<-g.started
	resp := b.do("GET", "/v1/turns/"+acc.TurnID+"/events", nil)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET events through B: %d", resp.StatusCode)
	}
	sse := newSSE(resp.Body)
	progress := 0
	for progress < 3 {
		ev, err := sse.next()
		if err != nil {
			t.Fatalf("following through B: %v after %d progress events", err, progress)
		}
		if ev.typ == "tool_progress" {
			progress++
		}
		if ev.typ == "turn_finished" {
			t.Fatalf("the turn ended before it was cancelled: %s", ev.data)
		}
	}

	er := decode[apiError](t, b.do("POST", "/v1/turns", map[string]any{"input": "too", "session_id": acc.SessionID}), http.StatusConflict)
	if er.Error.Code != "session_busy" {
		t.Fatalf("a second turn in the session through B: %+v", er)
	}

	rec := decode[rawRecord](t, b.do("POST", "/v1/turns/"+acc.TurnID+"/cancel", nil), http.StatusOK)
	if rec.Status != budget.StatusCancelled || rec.StopReason != budget.Cancelled {
		t.Fatalf("cancel through B answered %s (%s): %s", rec.Status, rec.StopReason, rec.Message)
	}
	select {
	case <-g.cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the tool running on A was not cancelled")
	}
	evs := sse.all(t)
	if len(evs) == 0 || evs[len(evs)-1].typ != "turn_finished" {
		t.Fatalf("B's stream ended with %+v", evs)
	}
	if got := a.record(acc.TurnID); got.Status != budget.StatusCancelled {
		t.Fatalf("A's record: %s", got.Status)
	}
	// Cancelling it again through either is "already ended".
	for _, e := range []*env{a, b} {
		if er := decode[apiError](t, e.do("POST", "/v1/turns/"+acc.TurnID+"/cancel", nil), http.StatusConflict); er.Error.Code != "already_ended" {
			t.Fatalf("%+v", er)
		}
	}
}

// TestSessionBusyInAnotherProcess: a session whose turn runs in another
// process sharing the store (here a recorder writing straight to it) is
// busy: 409 session_busy, not a store error.
func TestSessionBusyInAnotherProcess(t *testing.T) {
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, `{"text": "hi"}`))})
	rec := store.NewRecorder(e.st)
	if err := rec.Begin(context.Background(), store.TurnStart{TurnID: "t_cli", SessionID: "s_1", Input: "from the CLI", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	er := decode[apiError](t, e.do("POST", "/v1/turns", map[string]any{"input": "too", "session_id": "s_1"}), http.StatusConflict)
	if er.Error.Code != "session_busy" {
		t.Fatalf("%+v", er)
	}
}

// endsOnBegin is a store on which another process ends a turn of the
// session the moment a new one begins: the race of two gateways, one
// ending a session's turn while the other is asked for the next.
type endsOnBegin struct {
	store.Store
	before func()
}

func (s *endsOnBegin) BeginTurn(ctx context.Context, t store.TurnStart) error {
	if s.before != nil {
		s.before()
		s.before = nil
	}
	return s.Store.BeginTurn(ctx, t)
}

// TestHistoryReadOnceTheTurnHoldsTheSession: a turn begun just as another
// process ends the session's previous turn is given that turn's messages.
func TestHistoryReadOnceTheTurnHoldsTheSession(t *testing.T) {
	st := &endsOnBegin{Store: openStore(t)}
	rec := store.NewRecorder(st.Store)
	ctx := context.Background()
	if err := rec.Begin(ctx, store.TurnStart{TurnID: "t_other", SessionID: "s_1", Input: "first", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	st.before = func() {
		if err := rec.Finish(ctx, &event.Turn{TurnID: "t_other", SessionID: "s_1", Input: "first", Status: budget.StatusCompleted,
			StopReason: budget.Answered, StartedAt: time.Now(), EndedAt: time.Now()},
			[]model.Message{{Role: model.RoleUser, Content: "first"}, {Role: model.RoleAssistant, Content: "the other gateway's answer"}}); err != nil {
			t.Error(err)
		}
	}
	p := scripted(t, `{"text": "hi"}`)
	e := newEnv(t, server.Config{Store: st, Agent: newAgent(t, p)})
	decode[rawRecord](t, e.do("POST", "/v1/turns", map[string]any{"input": "second", "session_id": "s_1"}), http.StatusOK)
	var seen []string
	for _, m := range p.last().Messages {
		seen = append(seen, m.Content)
	}
	if !slices.Contains(seen, "the other gateway's answer") {
		t.Fatalf("the model was given %q, without the previous turn's answer", seen)
	}
}

// failsHistory is a store whose History fails.
type failsHistory struct{ store.Store }

func (failsHistory) History(context.Context, string) ([]model.Message, error) {
	return nil, errors.New("disk on fire")
}

// TestHistoryFailsAfterBegin: a turn whose session's history cannot be read
// is answered 500 and stored as ended (interrupted, nothing run), not left
// running.
func TestHistoryFailsAfterBegin(t *testing.T) {
	st := failsHistory{openStore(t)}
	e := newEnv(t, server.Config{Store: st, Agent: newAgent(t, scripted(t, `{"text": "hi"}`))})
	er := decode[apiError](t, e.do("POST", "/v1/turns", map[string]any{"input": "x", "session_id": "s_1"}), http.StatusInternalServerError)
	// The store's error is the log's; the client is told what failed.
	if strings.Contains(er.Error.Message, "disk on fire") || !strings.Contains(er.Error.Message, "starting the turn failed (request req_") {
		t.Fatalf("%+v", er)
	}
	list, err := st.Turns(context.Background(), store.Filter{})
	if err != nil || len(list) != 1 || list[0].Status != budget.StatusInterrupted || !strings.Contains(list[0].Message, "Nothing was run") ||
		strings.Contains(list[0].Message, "disk on fire") {
		t.Fatalf("%+v %v", list, err)
	}
	// The session is free for the next message.
	if e.srv.Running() != 0 {
		t.Fatalf("%d turns running", e.srv.Running())
	}
}

// openNotified opens a PostgreSQL store on dsn that hears of other
// stores' writes by notification alone: its poll, what a lost
// notification would have said, is an hour away, so a test that passes
// with it shows the notifications arrive.
func openNotified(t *testing.T, dsn string) *postgres.Store {
	t.Helper()
	st, err := postgres.Open(context.Background(), dsn, postgres.Options{Poll: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// route is a request of the API.
type route struct{ method, path, body string }

// readRoutes starts a gateway on a PostgreSQL of its own, runs a turn to
// its end — gone from the gateway's live turns, so that its routes read
// the store — and returns the routes that read the store for that turn.
func readRoutes(t *testing.T) (*testenv.PostgresServer, *env, []route) {
	t.Helper()
	pg := testenv.StartPostgres(t)
	e := newEnv(t, server.Config{Store: openNotified(t, pg.Database()), Agent: newAgent(t, scripted(t, `{"text": "hi"}`))})
	rec := decode[rawRecord](t, e.do("POST", "/v1/turns", map[string]any{"input": "go"}), http.StatusOK)
	wait.For(t, 10*time.Second, "the turn read from the store", func() bool {
		resp := e.do("GET", "/v1/turns/"+rec.TurnID+"/events?after=1000", nil)
		resp.Body.Close()
		return resp.StatusCode == http.StatusNoContent
	})
	id, session := rec.TurnID, rec.SessionID
	return pg, e, []route{
		{"GET", "/v1/turns", ""},
		{"GET", "/v1/turns/" + id, ""},
		{"GET", "/v1/turns/" + id + "/events", ""},
		{"POST", "/v1/turns/" + id + "/cancel", ""},
		{"GET", "/v1/turns/" + id + "/approvals", ""},
		{"POST", "/v1/turns/" + id + "/approvals/call_1_1", `{"decision": "approve"}`},
		{"GET", "/v1/sessions", ""},
		{"GET", "/v1/sessions/" + session, ""},
		{"GET", "/v1/stats", ""},
		{"GET", "/v1/stats?tool=fetch", ""},
		{"GET", "/v1/webhooks/deliveries", ""},
	}
}

// TestReadRoutesOfAnAwayDatabaseAre503: with its PostgreSQL stopped, every
// route that reads the store answers 503 store_unavailable with
// Retry-After (ask again shortly, or through another gateway), none 500
// store_error, which sent the person to the server's log for a database
// that was merely away: GET /v1/stats did until 2026-11-28.
func TestReadRoutesOfAnAwayDatabaseAre503(t *testing.T) {
	pg, e, routes := readRoutes(t)
	pg.Stop()
	t.Cleanup(pg.Start) // before the store is closed
	for _, r := range routes {
		var body any
		if r.body != "" {
			body = r.body
		}
		resp := e.do(r.method, r.path, body)
		var er apiError
		err := json.NewDecoder(resp.Body).Decode(&er)
		resp.Body.Close()
		if retry := resp.Header.Get("Retry-After"); err != nil || resp.StatusCode != http.StatusServiceUnavailable ||
			er.Error.Code != "store_unavailable" || retry == "" || strings.Contains(er.Error.Message, "  ") {
			t.Errorf("%s %s: %d %s, Retry-After %q: %s (%v)", r.method, r.path, resp.StatusCode, er.Error.Code, retry, er.Error.Message, err)
		}
	}
}
