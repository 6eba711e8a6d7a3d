package server_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
)

// orphans is a store whose engine turns "called" (its caller gone, its
// cancel requested as client_gone) and "detached" have no follower: the
// first look adopts them.
type orphans struct {
	store.Store
	mu    sync.Mutex
	given bool
	asked []string // engine/agent of each look
}

func (o *orphans) AdoptTurns(_ context.Context, engine, agent string, _ int) ([]string, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.asked = append(o.asked, engine+"/"+agent)
	if o.given {
		return nil, nil
	}
	o.given = true
	return []string{"called", "detached"}, nil
}

func (o *orphans) Follower(context.Context, string) (string, error) { return "", nil }

func (o *orphans) CancelReason(_ context.Context, turnID string) (*budget.CancelError, error) {
	if turnID == "called" {
		return &budget.CancelError{Reason: budget.ClientGone, By: "the process following it for its client, which is gone"}, nil
	}
	return nil, nil
}

// adopter is an engine's Runner that follows the turns it adopts until
// its context ends, and notes why it did.
type adopter struct {
	followingRunner
	mu     sync.Mutex
	causes map[string]error
	began  chan string
}

func (a *adopter) Adopt(ctx context.Context, in agent.Input, _ ...event.Sink) *agent.Result {
	a.began <- in.TurnID
	<-ctx.Done()
	a.mu.Lock()
	a.causes[in.TurnID] = context.Cause(ctx)
	a.mu.Unlock()
	return &agent.Result{Record: &event.Turn{TurnID: in.TurnID, Status: budget.StatusRunning}}
}

// TestServeAdoptsTurnsWithNoFollower: Serve adopts the turns of its
// engine and agent whose follower is gone, and follows each as a turn of
// its own: a cancel requested before it adopted the turn (its caller is
// gone) is passed on at once, with its reason; at shutdown it stops
// following the others, and cancels none.
func TestServeAdoptsTurnsWithNoFollower(t *testing.T) {
	st := &orphans{Store: store.NewMemory()}
	a := &adopter{followingRunner: followingRunner{started: make(chan struct{}), cause: make(chan error, 1)},
		causes: map[string]error{}, began: make(chan string, 2)}
	e := newEnv(t, server.Config{Agent: a, AgentName: "x", Store: st, AdoptInterval: 10 * time.Millisecond})
	for range 2 {
		select {
		case <-a.began:
		case <-time.After(10 * time.Second):
			t.Fatal("the turns with no follower were not adopted")
		}
	}
	if err := e.stop(); err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if ce, ok := budget.AsCancel(a.causes["called"]); !ok || ce.Reason != budget.ClientGone {
		t.Errorf("the adopted turn whose cancel was requested ended following with %v, want its client_gone", a.causes["called"])
	}
	if c := a.causes["detached"]; !errors.Is(c, agent.ErrStopFollowing) {
		t.Errorf("the detached turn ended following with %v at shutdown, want agent.ErrStopFollowing", c)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.asked) == 0 || st.asked[0] != "fake/x" {
		t.Errorf("looked for %v, want the turns of engine fake and agent x", st.asked)
	}
}
