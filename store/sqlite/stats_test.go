package sqlite_test

import (
	"database/sql"
	"encoding/json"
	"path/filepath"
	"testing"

	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/sqlite"
	"github.com/timebox-run/timebox/store/storetest"
)

func TestStats(t *testing.T) {
	storetest.RunStats(t, func(t *testing.T) store.Store { return open(t, filepath.Join(t.TempDir(), "timebox.db")) })
}

// TestStatsAfterMigration stores records in a store of schema version 1,
// before the columns stats reads, and reads them through stats once Open
// has migrated it.
func TestStatsAfterMigration(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	tools, models := storetest.LegacyCalls()
	must := func(_ sql.Result, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(db.Exec(sqlite.Migrations[0]))
	must(db.Exec(`PRAGMA user_version = 1`))
	must(db.Exec(`INSERT INTO turns (turn_id, input, status, started_at) VALUES (?, 'x', 'completed', 0)`, storetest.LegacyTurn))
	for _, tc := range tools {
		rec, _ := json.Marshal(tc)
		must(db.Exec(`INSERT INTO tool_calls (turn_id, call_id, tool, outcome, started_at, duration_ms, late_result, record)
			VALUES (?, ?, ?, ?, ?, ?, 0, ?)`, tc.TurnID, tc.CallID, tc.Tool, tc.Outcome, tc.StartedAt.UnixNano(), tc.DurationMS, rec))
	}
	for i, mc := range models {
		rec, _ := json.Marshal(mc)
		must(db.Exec(`INSERT INTO model_calls (turn_id, idx, step, model, outcome, record) VALUES (?, ?, ?, ?, ?, ?)`,
			storetest.LegacyTurn, i, mc.Step, mc.Model, mc.Outcome, rec))
	}
	db.Close()

	s := open(t, path)
	defer s.Close()
	storetest.CheckLegacyStats(t, s)
}
