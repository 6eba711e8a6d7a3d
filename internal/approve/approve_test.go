package approve_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/approve"
	"github.com/timebox-run/timebox/store"
)

func request(t *testing.T, st *store.Memory, wait time.Duration) agent.ApprovalRequest {
	t.Helper()
	if err := st.BeginTurn(t.Context(), store.TurnStart{TurnID: "t_a", Input: "x", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	req := agent.ApprovalRequest{TurnID: "t_a", CallID: "call_1_1", Tool: "deploy", Round: 1, RequestedAt: time.Now(), ExpiresAt: time.Now().Add(wait)}
	if err := approve.New(st).(agent.ApprovalAsker).Asked(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	return req
}

// A decision stored while the call waits wakes it at once, without the poll.
func TestApproveWakesOnADecision(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := store.NewMemory()
		req := request(t, st, time.Hour)
		go func() {
			time.Sleep(time.Second)
			st.Decide(context.Background(), "t_a", "call_1_1", store.Approval{Decision: event.Deny, By: "bob", Reason: "no", DecidedAt: time.Now()})
		}()
		start := time.Now()
		d, err := approve.New(st).Approve(t.Context(), req)
		if err != nil || d.Decision != event.Deny || d.By != "bob" || time.Since(start) != time.Second {
			t.Fatalf("%+v, %v after %s", d, err, time.Since(start))
		}
	})
}

// At its expiry the call stores its expiry, unless a decision came first.
func TestApproveExpires(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := store.NewMemory()
		req := request(t, st, 5*time.Second)
		ctx, cancel := context.WithDeadline(t.Context(), req.ExpiresAt)
		defer cancel()
		d, err := approve.New(st).Approve(ctx, req)
		if err != nil || d.Decision != event.Expired {
			t.Fatalf("%+v, %v", d, err)
		}
		if got, _ := st.Approval(t.Context(), "t_a", "call_1_1"); got.Decision != event.Expired {
			t.Fatalf("stored %+v", got)
		}
		// A decision after it is refused: the expiry stands.
		if d, ok, _ := approve.Decided(t.Context(), st, "t_a", "call_1_1", 1); !ok || d.Decision != event.Expired {
			t.Fatalf("decided %+v %v", d, ok)
		}
	})
}
