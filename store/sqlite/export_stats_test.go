package sqlite

import (
	"context"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store/storetest"
)

// Migrations are the schema's versions, for tests that make a store of an
// earlier version.
var Migrations = migrations

// SeedCalls stores call records in one transaction, with the turns they
// belong to, through the functions that store the records AppendEvent and
// FinishTurn are given: for the benchmark of a million calls.
func (s *Store) SeedCalls(ctx context.Context, tools []event.ToolCall, models []storetest.TurnModelCall) error {
	return s.tx(ctx, func(tx *wtx) error {
		for _, tc := range tools {
			if _, err := tx.ExecContext(ctx, `INSERT OR IGNORE INTO turns (turn_id, input, status, started_at) VALUES (?, 'x', 'completed', ?)`,
				tc.TurnID, nanos(tc.StartedAt)); err != nil {
				return err
			}
			if err := putToolCall(ctx, tx, tc); err != nil {
				return err
			}
		}
		for _, mc := range models {
			if err := addModelCall(ctx, tx, mc.TurnID, mc.ModelCall); err != nil {
				return err
			}
		}
		return nil
	})
}
