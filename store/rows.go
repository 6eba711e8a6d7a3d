package store

import (
	"database/sql"
	"encoding/json"
	"fmt"
	"time"

	"github.com/timebox-run/timebox/event"
)

// Row is a database row to read: database/sql's and pgx's both are. The
// SQL stores read approvals and deliveries, whose columns are the same in
// each, with ScanApproval and ScanDelivery.
type Row interface {
	Scan(dest ...any) error
}

// ApprovalColumns are the columns ScanApproval reads, in order.
const ApprovalColumns = `turn_id, call_id, round, tool, arguments, requested_at, expires_at, decision, by_whom, reason, decided_at`

// ScanApproval reads an approval's row (ApprovalColumns; times are Unix
// nanoseconds).
func ScanApproval(r Row) (Approval, error) {
	var a Approval
	var args, decision string
	var requested, expires int64
	var decided sql.NullInt64
	if err := r.Scan(&a.TurnID, &a.CallID, &a.Round, &a.Tool, &args, &requested, &expires, &decision, &a.By, &a.Reason, &decided); err != nil {
		return a, err
	}
	if args != "" {
		a.Arguments = []byte(args)
	}
	a.Decision = event.Decision(decision)
	a.RequestedAt, a.ExpiresAt = fromNanos(requested), fromNanos(expires)
	if decided.Valid {
		a.DecidedAt = fromNanos(decided.Int64)
	}
	return a, nil
}

// DeliveryColumns are the columns ScanDelivery reads, in order; body, when
// asked for, follows them.
const DeliveryColumns = `id, url, event_type, turn_id, seq, created_at, state, next_attempt_at, attempts`

// ScanDelivery reads a delivery's row (DeliveryColumns, then the body
// into body when it is not nil): a delivery that is not pending has no
// next attempt, and its attempts are a JSON list.
func ScanDelivery(r Row, body *[]byte) (Delivery, error) {
	var d Delivery
	var created, next int64
	var attempts, state string
	dest := []any{&d.ID, &d.URL, &d.EventType, &d.TurnID, &d.Seq, &created, &state, &next, &attempts}
	if body != nil {
		dest = append(dest, body)
	}
	if err := r.Scan(dest...); err != nil {
		return d, err
	}
	d.State = DeliveryState(state)
	d.CreatedAt = fromNanos(created)
	if d.State == DeliveryPending && next != 0 {
		d.NextAttemptAt = fromNanos(next)
	}
	if err := json.Unmarshal([]byte(attempts), &d.Attempts); err != nil {
		return d, fmt.Errorf("delivery %s: its attempts: %w", d.ID, err)
	}
	if d.Attempts == nil {
		d.Attempts = []DeliveryAttempt{}
	}
	return d, nil
}

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }
