package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

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
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var ids []string
		var ats []int64
		for _, tc := range tools {
			ids, ats = append(ids, tc.TurnID), append(ats, nanos(tc.StartedAt))
		}
		if _, err := tx.Exec(ctx, `INSERT INTO turns (turn_id, input, status, started_at)
			SELECT id, 'x', 'completed', at FROM unnest($1::text[], $2::bigint[]) AS u(id, at) ON CONFLICT DO NOTHING`, ids, ats); err != nil {
			return err
		}
		b := newBatch(tx)
		for _, tc := range tools {
			if err := queueToolCall(ctx, b, tc); err != nil {
				return err
			}
		}
		for _, mc := range models {
			if err := queueModelCall(&b.Batch, mc.TurnID, mc.ModelCall); err != nil {
				return err
			}
		}
		return b.send(ctx)
	})
}

// Vacuum runs VACUUM ANALYZE on the call tables, as autovacuum would after
// a bulk of writes: the benchmark reads them as a database that has been
// running for a while is read.
func (s *Store) Vacuum(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, `VACUUM ANALYZE tool_calls, model_calls`)
	return err
}
