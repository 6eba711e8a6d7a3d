// Package approve is the store's side of approvals: a call's request for
// a person's decision is stored before its turn announces it, and the
// decision is whichever the store took first — a person's, through any
// process sharing the store, or the call's own expiry. The server's turns
// wait on it in their process; a Temporal workflow's calls read it when a
// signal or their timer wakes them.
package approve

import (
	"context"
	"errors"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
)

// Poll is how often a call waiting for a decision reads the store again
// when nothing woke it: a store that cannot signal a decision made through
// another process (SQLite) is heard within it.
const Poll = 2 * time.Second

// Store is an agent.ApprovalAsker over a store.
type Store struct {
	st store.Store
	ap store.Approvals
}

var _ agent.ApprovalAsker = Store{}

// New returns the Approver of st, or nil when st keeps no approvals.
func New(st store.Store) agent.Approver {
	ap, ok := st.(store.Approvals)
	if !ok {
		return nil
	}
	return Store{st: st, ap: ap}
}

// Asked implements agent.ApprovalAsker: the request is stored before
// approval_requested reaches anyone, so a decision that follows the event
// finds it.
func (a Store) Asked(ctx context.Context, req agent.ApprovalRequest) error {
	return a.ap.RequestApproval(ctx, store.Approval{TurnID: req.TurnID, CallID: req.CallID, Round: req.Round, Tool: req.Tool,
		Arguments: req.Arguments, RequestedAt: req.RequestedAt, ExpiresAt: req.ExpiresAt})
}

// Approve implements agent.Approver: it waits for the store to hold a
// decision on req's round, reading it again when the turn's watchers are
// woken (a decision made here or, on PostgreSQL, anywhere) and every Poll.
func (a Store) Approve(ctx context.Context, req agent.ApprovalRequest) (agent.Decision, error) {
	changed, unwatch := a.st.Watch(req.TurnID)
	defer unwatch()
	tick := time.NewTicker(Poll)
	defer tick.Stop()
	for {
		ap, err := a.ap.Approval(ctx, req.TurnID, req.CallID)
		if err == nil && ap.Round == req.Round && ap.Decision != "" {
			return decisionOf(ap), nil
		}
		select {
		case <-changed:
		case <-tick.C:
		case <-ctx.Done():
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return agent.Decision{}, ctx.Err()
			}
			return Expire(context.WithoutCancel(ctx), a.ap, req.TurnID, req.CallID, req.ExpiresAt)
		}
	}
}

// Expire stores the expiry of a call's wait at expires, unless a decision
// came first, and returns the decision that stands.
func Expire(ctx context.Context, ap store.Approvals, turnID, callID string, expires time.Time) (agent.Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got, err := ap.Decide(ctx, turnID, callID, store.Approval{Decision: event.Expired, DecidedAt: expires})
	if err != nil && !errors.Is(err, store.ErrDecided) {
		return agent.Decision{}, err
	}
	return decisionOf(got), nil
}

// Decided returns the decision the store holds on round of a call, if it
// holds one.
func Decided(ctx context.Context, ap store.Approvals, turnID, callID string, round int) (agent.Decision, bool, error) {
	got, err := ap.Approval(ctx, turnID, callID)
	if err != nil || got.Round != round || got.Decision == "" {
		return agent.Decision{}, false, err
	}
	return decisionOf(got), true, nil
}

func decisionOf(ap store.Approval) agent.Decision {
	return agent.Decision{Decision: ap.Decision, By: ap.By, Reason: ap.Reason, At: ap.DecidedAt}
}
