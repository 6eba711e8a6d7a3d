package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/timebox-run/timebox/store"
)

var _ store.Suspender = (*Store)(nil)

// suspendedOwner owns a suspended turn: no process.
const suspendedOwner = "suspended"

// SuspendTurn implements store.Suspender.
func (s *Store) SuspendTurn(ctx context.Context, turnID string, checkpoint []byte) error {
	if err := s.Flush(ctx); err != nil {
		return err
	}
	return s.durable(ctx, "the checkpoint of turn "+turnID, func(tx *wtx) error {
		res, err := tx.ExecContext(ctx, `UPDATE turns SET owner_id = ? WHERE turn_id = ? AND status = 'running'`, suspendedOwner, turnID)
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("turn %s: %w", turnID, store.ErrNotRunning)
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO suspended_turns (turn_id, checkpoint, suspended_at) VALUES (?, ?, ?)
			ON CONFLICT (turn_id) DO UPDATE SET checkpoint = excluded.checkpoint, suspended_at = excluded.suspended_at`,
			turnID, checkpoint, time.Now().UnixNano())
		return err
	})
}

// SuspendedTurns implements store.Suspender.
func (s *Store) SuspendedTurns(ctx context.Context) ([]string, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	return queryStrings(ctx, s.r, `SELECT turn_id FROM suspended_turns ORDER BY suspended_at, turn_id`)
}

// ResumeTurn implements store.Suspender.
func (s *Store) ResumeTurn(ctx context.Context, turnID string) ([]byte, error) {
	var cp []byte
	err := s.tx(ctx, func(tx *wtx) error {
		err := tx.QueryRowContext(ctx, `DELETE FROM suspended_turns WHERE turn_id = ? RETURNING checkpoint`, turnID).Scan(&cp)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("suspended turn %s: %w", turnID, store.ErrNotFound)
		}
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `UPDATE turns SET owner_id = ? WHERE turn_id = ?`, s.owner, turnID)
		return err
	})
	return cp, err
}
