package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/timebox-run/timebox/store"
)

var _ store.Suspender = (*Store)(nil)

// suspendedOwner owns a suspended turn: no gateway; its engine prefix
// keeps it from being taken for an orphan.
const suspendedOwner = enginePrefix + "suspended"

// SuspendTurn implements store.Suspender.
func (s *Store) SuspendTurn(ctx context.Context, turnID string, checkpoint []byte) error {
	if err := s.Flush(ctx); err != nil {
		return err
	}
	return s.durable(ctx, "the checkpoint of turn "+turnID, func(tx pgx.Tx) error {
		tag, err := tx.Exec(ctx, `UPDATE turns SET owner_id = $1 WHERE turn_id = $2 AND status = 'running'`, suspendedOwner, turnID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("turn %s: %w", turnID, store.ErrNotRunning)
		}
		_, err = tx.Exec(ctx, `INSERT INTO suspended_turns (turn_id, checkpoint, suspended_at) VALUES ($1, $2, $3)
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
	return queryStrings(ctx, s.pool, `SELECT turn_id FROM suspended_turns ORDER BY suspended_at, turn_id`)
}

// ResumeTurn implements store.Suspender: of two gateways resuming a turn
// at once, one gets it.
func (s *Store) ResumeTurn(ctx context.Context, turnID string) ([]byte, error) {
	var cp []byte
	err := s.tx(ctx, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, `DELETE FROM suspended_turns WHERE turn_id = $1 RETURNING checkpoint`, turnID).Scan(&cp)
		if isNoRows(err) {
			return fmt.Errorf("suspended turn %s: %w", turnID, store.ErrNotFound)
		}
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE turns SET owner_id = $1 WHERE turn_id = $2`, s.owner, turnID)
		return err
	})
	return cp, err
}
