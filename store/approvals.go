package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/timebox-run/timebox/event"
)

// ErrDecided is returned (wrapped) by Decide for a call already decided,
// or whose wait expired.
var ErrDecided = errors.New("already decided")

// Approval is one request for a person's decision on a tool call, and the
// decision once made: what approval_requested asked and what
// approval_decided will say.
type Approval struct {
	// TurnID (turn_id) and CallID (call_id) name the turn and the call
	// that waits.
	TurnID string `json:"turn_id"`
	CallID string `json:"call_id"`
	// Round counts the requests for the call, from 1 (a decision that
	// could not be used at once is asked for again).
	Round int `json:"round"`
	// Tool is the tool's name, and Arguments the arguments the model sent
	// (JSON).
	Tool      string          `json:"tool"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	// RequestedAt (requested_at) is when the call began to wait, and
	// ExpiresAt (expires_at) when it stops waiting without a decision
	// (approval_expired).
	RequestedAt time.Time `json:"requested_at"`
	ExpiresAt   time.Time `json:"expires_at"`
	// Decision is empty while the call waits.
	Decision event.Decision `json:"decision,omitempty"`
	// By is who decided and Reason why, in their words; empty (omitted)
	// while the call waits, By also for an expiry.
	By     string `json:"by,omitempty"`
	Reason string `json:"reason,omitempty"`
	// DecidedAt (decided_at) is when the decision was made; zero (omitted)
	// while the call waits.
	DecidedAt time.Time `json:"decided_at,omitzero"`
}

// Pending reports whether the call still waits for a decision at now.
func (a *Approval) Pending(now time.Time) bool { return a.Decision == "" && now.Before(a.ExpiresAt) }

// Approvals is a store that keeps the requests for people's decisions and
// the decisions: the one place where a decision is made, whichever
// process takes it (a gateway's route, the turn's own expiry), so that the
// first decision wins and the others are refused. Memory, SQLite and
// PostgreSQL are Approvals; with PostgreSQL a call waiting in one gateway
// is decided through any.
type Approvals interface {
	// RequestApproval stores a request (a.Decision empty). Storing one
	// already stored (the same turn, call and round) is a no-op.
	RequestApproval(ctx context.Context, a Approval) error
	// Decide records d (Decision, By, Reason, DecidedAt) on the last
	// round of call callID of turn turnID, if it still waits at
	// d.DecidedAt — an Expired decision is taken at or after its
	// ExpiresAt — and wakes the turn's watchers (Watch). It returns the
	// approval as it stands: d's, or, with ErrDecided, the decision that
	// came first (an expiry too). An unknown call is ErrNotFound.
	Decide(ctx context.Context, turnID, callID string, d Approval) (Approval, error)
	// Approval returns the last round of call callID of turn turnID;
	// ErrNotFound when none was requested.
	Approval(ctx context.Context, turnID, callID string) (Approval, error)
	// Approvals returns the last round of every call of turn turnID
	// that waited for a decision, in the order those rounds were
	// requested.
	Approvals(ctx context.Context, turnID string) ([]Approval, error)
}

// decide applies d to the last round a of a call, as every store does:
// a call that no longer waits keeps its decision (ErrDecided), an expiry
// before the wait's end and a decision after it are refused.
func decide(a *Approval, d Approval) error {
	switch {
	case a.Decision != "":
		return fmt.Errorf("call %s of turn %s: %w (%s)", a.CallID, a.TurnID, ErrDecided, a.Decision)
	case d.Decision == event.Expired && d.DecidedAt.Before(a.ExpiresAt):
		return fmt.Errorf("call %s of turn %s has not expired: it waits until %s", a.CallID, a.TurnID, a.ExpiresAt.Format(time.RFC3339))
	case d.Decision != event.Expired && !d.DecidedAt.Before(a.ExpiresAt):
		// The wait is over: the call expires now, whoever notices first.
		a.Decision, a.By, a.Reason, a.DecidedAt = event.Expired, "", "", a.ExpiresAt
		return fmt.Errorf("call %s of turn %s: %w (its wait for a decision expired at %s)", a.CallID, a.TurnID, ErrDecided, a.ExpiresAt.Format(time.RFC3339))
	}
	a.Decision, a.By, a.Reason, a.DecidedAt = d.Decision, d.By, d.Reason, d.DecidedAt
	return nil
}

// DecideApproval is the rule every Approvals store applies in Decide, for
// implementations outside this package: it updates a, the call's last
// round, with d, or returns why not (ErrDecided, wrapped; a refused early
// expiry). When the wait is over, a becomes the expiry that a stores.
func DecideApproval(a *Approval, d Approval) error { return decide(a, d) }

// CheckDecision returns an error unless d is a decision a person can make
// (approve or deny) or an expiry.
func CheckDecision(d event.Decision) error {
	switch d {
	case event.Approve, event.Deny, event.Expired:
		return nil
	}
	return fmt.Errorf("%q is not a decision: approve or deny", d)
}
