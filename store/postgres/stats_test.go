package postgres_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/store/storetest"
)

func TestStats(t *testing.T) {
	storetest.RunStats(t, func(t *testing.T) store.Store { return open(t, testenv.Postgres(t), postgres.Options{}) })
}

// TestStatsAfterMigration stores records in a database of schema version
// 3, before the columns stats reads (one record holding \u0000, which
// PostgreSQL's json cannot give back as text), and reads them through
// stats once Open has migrated it.
func TestStatsAfterMigration(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	must := func(_ pgconn.CommandTag, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(conn.Exec(ctx, `CREATE TABLE timebox_schema (version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`))
	for v := range 3 {
		must(conn.Exec(ctx, postgres.Migrations[v]))
		must(conn.Exec(ctx, `INSERT INTO timebox_schema (version) VALUES ($1)`, v+1))
	}
	must(conn.Exec(ctx, `INSERT INTO turns (turn_id, input, status, started_at) VALUES ($1, 'x', 'completed', 0)`, storetest.LegacyTurn))
	tools, models := storetest.LegacyCalls()
	nul := tools[0]
	nul.CallID, nul.StartedAt, nul.Result = "call_nul", nul.StartedAt.Add(-time.Hour), "a\x00b"
	for _, tc := range append(tools, nul) {
		rec, _ := json.Marshal(tc)
		must(conn.Exec(ctx, `INSERT INTO tool_calls (turn_id, call_id, tool, outcome, started_at, duration_ms, late_result, record)
			VALUES ($1, $2, $3, $4, $5, $6, false, $7)`, tc.TurnID, tc.CallID, tc.Tool, string(tc.Outcome), tc.StartedAt.UnixNano(), tc.DurationMS, string(rec)))
	}
	for i, mc := range models {
		rec, _ := json.Marshal(mc)
		must(conn.Exec(ctx, `INSERT INTO model_calls (turn_id, idx, step, model, outcome, record) VALUES ($1, $2, $3, $4, $5, $6)`,
			storetest.LegacyTurn, i, mc.Step, mc.Model, string(mc.Outcome), string(rec)))
	}
	conn.Close(ctx)

	s := open(t, dsn, postgres.Options{})
	defer s.Close()
	storetest.CheckLegacyStats(t, s)
}
