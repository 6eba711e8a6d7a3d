package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/timebox-run/timebox/store"
)

var _ store.Approvals = (*Store)(nil)

// RequestApproval implements store.Approvals.
func (s *Store) RequestApproval(ctx context.Context, a store.Approval) error {
	return s.durable(ctx, "an approval request of turn "+a.TurnID, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO approvals (turn_id, call_id, round, tool, arguments, requested_at, expires_at)
			VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING`,
			a.TurnID, a.CallID, a.Round, a.Tool, text(string(a.Arguments)), nanos(a.RequestedAt), nanos(a.ExpiresAt))
		return err
	})
}

// Decide implements store.Approvals. The call's last round is locked
// for the decision, so that of two gateways deciding at once the first
// wins; the turn's gateway hears of it at once (NOTIFY), the others by
// their next read.
func (s *Store) Decide(ctx context.Context, turnID, callID string, d store.Approval) (store.Approval, error) {
	var out store.Approval
	var refused error
	err := s.durable(ctx, "a decision on call "+callID+" of turn "+turnID, func(tx pgx.Tx) error {
		a, err := store.ScanApproval(tx.QueryRow(ctx, `SELECT `+store.ApprovalColumns+` FROM approvals
			WHERE turn_id = $1 AND call_id = $2 ORDER BY round DESC LIMIT 1 FOR UPDATE`, turnID, callID))
		if isNoRows(err) {
			return fmt.Errorf("call %s of turn %s: %w", callID, turnID, store.ErrNotFound)
		}
		if err != nil {
			return err
		}
		before := a.Decision
		refused = store.DecideApproval(&a, d)
		out = a
		if before != "" || a.Decision == "" {
			return nil // decided before, or an early expiry refused
		}
		if _, err := tx.Exec(ctx, `UPDATE approvals SET decision = $1, by_whom = $2, reason = $3, decided_at = $4
			WHERE turn_id = $5 AND call_id = $6 AND round = $7`,
			string(a.Decision), text(a.By), text(a.Reason), nanos(a.DecidedAt), turnID, callID, a.Round); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `SELECT pg_notify($1, $2)`, chanEvents, turnID)
		return err
	})
	if err != nil {
		return store.Approval{}, err
	}
	return out, refused
}

// Approval implements store.Approvals.
func (s *Store) Approval(ctx context.Context, turnID, callID string) (store.Approval, error) {
	return again(ctx, s, func(ctx context.Context) (store.Approval, error) { return s.approvalOnce(ctx, turnID, callID) })
}

func (s *Store) approvalOnce(ctx context.Context, turnID, callID string) (store.Approval, error) {
	if s.isClosed() {
		return store.Approval{}, store.ErrClosed
	}
	a, err := store.ScanApproval(s.pool.QueryRow(ctx, `SELECT `+store.ApprovalColumns+` FROM approvals
		WHERE turn_id = $1 AND call_id = $2 ORDER BY round DESC LIMIT 1`, turnID, callID))
	if isNoRows(err) {
		return a, fmt.Errorf("call %s of turn %s: %w", callID, turnID, store.ErrNotFound)
	}
	return a, err
}

// Approvals implements store.Approvals.
func (s *Store) Approvals(ctx context.Context, turnID string) ([]store.Approval, error) {
	return again(ctx, s, func(ctx context.Context) ([]store.Approval, error) { return s.approvalsOnce(ctx, turnID) })
}

func (s *Store) approvalsOnce(ctx context.Context, turnID string) ([]store.Approval, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	rows, err := s.pool.Query(ctx, `SELECT `+store.ApprovalColumns+` FROM (SELECT DISTINCT ON (call_id) * FROM approvals
		WHERE turn_id = $1 ORDER BY call_id, round DESC) last ORDER BY n`, turnID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.Approval
	for rows.Next() {
		a, err := store.ScanApproval(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}
