package server

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
)

type noRunner struct{}

func (noRunner) Run(context.Context, agent.Input, ...event.Sink) *agent.Result { return nil }

// A follower whose turn ended just before the server closed its streams
// still ends with turn_finished: the frames it had not sent yet race the
// closing server in one select, and the closing server must not win.
// Without the fix this fails in almost every round (each frame is a coin
// toss against the closed channel).
func TestStreamClosedByShutdownEndsWithTurnFinished(t *testing.T) {
	for round := range 30 {
		st := store.NewMemory()
		s, err := New(Config{Agent: noRunner{}, Store: st})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		id := agent.NewTurnID()
		if err := st.BeginTurn(ctx, store.TurnStart{TurnID: id, StartedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		lt := &liveTurn{id: id, hub: newHub(), ended: make(chan struct{}), done: make(chan struct{})}
		sb, _, _ := lt.hub.subscribe()
		em := event.NewEmitter(id, &turnSink{s: s, lt: lt})
		em.Emit(&event.ToolStarted{CallID: "c1", Tool: "wait"})
		em.Emit(&event.ToolFinished{ToolCall: event.ToolCall{CallID: "c1", Tool: "wait", Outcome: event.OutcomeCancelled}})
		em.Emit(&event.TurnFinished{Status: budget.StatusCancelled, StopReason: budget.Shutdown})
		rec := &event.Turn{TurnID: id, Status: budget.StatusCancelled, StopReason: budget.Shutdown, Events: em.Log()}
		if err := st.FinishTurn(ctx, rec, nil); err != nil {
			t.Fatal(err)
		}
		// As Server.run and Shutdown do it: the record is stored, the hub
		// ends, done closes, and then the server closes its streams.
		lt.hub.end()
		close(lt.done)
		close(s.closing)

		w := httptest.NewRecorder()
		x := &sse{w: w, rc: http.NewResponseController(w), deadline: time.Second}
		ss := &streamState{s: s, x: x, ctx: ctx, id: id, keepAlive: time.NewTicker(time.Hour)}
		end := ss.follow(lt, sb)
		ss.keepAlive.Stop()
		body := w.Body.String()
		if end != endFinished || !strings.Contains(body, "event: turn_finished") {
			t.Fatalf("round %d: stream ended %v without turn_finished:\n%s", round, end, body)
		}
		if n := strings.Count(body, "event: "); n != 3 {
			t.Fatalf("round %d: %d events sent, want 3:\n%s", round, n, body)
		}
	}
}
