package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/timebox-run/timebox/store"
)

var _ store.Approvals = (*Store)(nil)

// RequestApproval implements store.Approvals.
func (s *Store) RequestApproval(ctx context.Context, a store.Approval) error {
	return s.durable(ctx, "an approval request of turn "+a.TurnID, func(tx *wtx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO approvals (turn_id, call_id, round, n, tool, arguments, requested_at, expires_at)
			VALUES (?, ?, ?, (SELECT COUNT(*) FROM approvals WHERE turn_id = ?), ?, ?, ?, ?)
			ON CONFLICT DO NOTHING`,
			a.TurnID, a.CallID, a.Round, a.TurnID, a.Tool, string(a.Arguments), a.RequestedAt.UnixNano(), a.ExpiresAt.UnixNano())
		return err
	})
}

// Decide implements store.Approvals: in one write transaction, so that of
// two decisions (a person's, the turn's expiry) the first wins.
func (s *Store) Decide(ctx context.Context, turnID, callID string, d store.Approval) (store.Approval, error) {
	var out store.Approval
	var refused error
	err := s.durable(ctx, "a decision on call "+callID+" of turn "+turnID, func(tx *wtx) error {
		a, err := lastApproval(ctx, tx.Tx, turnID, callID)
		if err != nil {
			return err
		}
		before := a.Decision
		refused = store.DecideApproval(&a, d)
		out = a
		if before != "" || a.Decision == "" {
			return nil // decided before, or an early expiry refused
		}
		_, err = tx.ExecContext(ctx, `UPDATE approvals SET decision = ?, by_whom = ?, reason = ?, decided_at = ?
			WHERE turn_id = ? AND call_id = ? AND round = ? AND decision = ''`,
			string(a.Decision), a.By, a.Reason, a.DecidedAt.UnixNano(), turnID, callID, a.Round)
		return err
	})
	if err != nil {
		return store.Approval{}, err
	}
	s.watch.Wake(turnID)
	return out, refused
}

// Approval implements store.Approvals.
func (s *Store) Approval(ctx context.Context, turnID, callID string) (store.Approval, error) {
	if s.isClosed() {
		return store.Approval{}, store.ErrClosed
	}
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return store.Approval{}, err
	}
	defer tx.Rollback()
	return lastApproval(ctx, tx, turnID, callID)
}

// Approvals implements store.Approvals.
func (s *Store) Approvals(ctx context.Context, turnID string) ([]store.Approval, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	rows, err := s.r.QueryContext(ctx, `SELECT `+store.ApprovalColumns+` FROM approvals a WHERE turn_id = ?
		AND round = (SELECT MAX(round) FROM approvals b WHERE b.turn_id = a.turn_id AND b.call_id = a.call_id)
		ORDER BY n`, turnID)
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

func lastApproval(ctx context.Context, tx *sql.Tx, turnID, callID string) (store.Approval, error) {
	a, err := store.ScanApproval(tx.QueryRowContext(ctx, `SELECT `+store.ApprovalColumns+` FROM approvals
		WHERE turn_id = ? AND call_id = ? ORDER BY round DESC LIMIT 1`, turnID, callID))
	if errors.Is(err, sql.ErrNoRows) {
		return a, fmt.Errorf("call %s of turn %s: %w", callID, turnID, store.ErrNotFound)
	}
	return a, err
}
