package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// migrations are the schema's versions, in order: migrations[i] takes a
// database from version i to i+1 (PRAGMA user_version). Released entries
// are never edited; a change is a new entry.
var migrations = []string{
	// 1: sessions, turns, events, call records, conversations, and the
	// processes that own running turns.
	`
CREATE TABLE owners (
	owner_id     TEXT PRIMARY KEY,
	pid          INTEGER NOT NULL,
	pid_start    TEXT NOT NULL DEFAULT '',
	machine      TEXT NOT NULL,
	started_at   INTEGER NOT NULL,
	heartbeat_at INTEGER NOT NULL
);

CREATE TABLE sessions (
	session_id TEXT PRIMARY KEY,
	created_at INTEGER NOT NULL,
	updated_at INTEGER NOT NULL
);
CREATE INDEX sessions_by_update ON sessions(updated_at);

CREATE TABLE turns (
	n           INTEGER PRIMARY KEY AUTOINCREMENT,
	turn_id     TEXT NOT NULL UNIQUE,
	session_id  TEXT NOT NULL DEFAULT '',
	agent       TEXT NOT NULL DEFAULT '',
	input       TEXT NOT NULL,
	status      TEXT NOT NULL,
	stop_reason TEXT NOT NULL DEFAULT '',
	message     TEXT NOT NULL DEFAULT '',
	started_at  INTEGER NOT NULL,
	ended_at    INTEGER,
	wall_ms     INTEGER NOT NULL DEFAULT 0,
	steps       INTEGER NOT NULL DEFAULT 0,
	owner_id    TEXT NOT NULL DEFAULT '',
	record      TEXT
);
CREATE INDEX turns_by_status      ON turns(status, n);
CREATE INDEX turns_by_stop_reason ON turns(stop_reason, n);
CREATE INDEX turns_by_session     ON turns(session_id, n);

-- Events are appended in rowid order, so concurrent turns write to the
-- table's last pages rather than each to its own; only the small index
-- entries are spread out. Fewer dirty pages per commit is most of the cost
-- of many streaming turns.
CREATE TABLE events (
	id      INTEGER PRIMARY KEY,
	turn_id TEXT    NOT NULL REFERENCES turns(turn_id),
	seq     INTEGER NOT NULL,
	type    TEXT    NOT NULL,
	at      INTEGER NOT NULL,
	data    TEXT    NOT NULL
);
CREATE UNIQUE INDEX events_by_turn ON events(turn_id, seq);

CREATE TABLE tool_calls (
	turn_id     TEXT    NOT NULL REFERENCES turns(turn_id),
	call_id     TEXT    NOT NULL,
	tool        TEXT    NOT NULL,
	outcome     TEXT    NOT NULL,
	started_at  INTEGER NOT NULL,
	duration_ms INTEGER NOT NULL,
	late_result INTEGER NOT NULL DEFAULT 0,
	record      TEXT    NOT NULL,
	PRIMARY KEY (turn_id, call_id)
) WITHOUT ROWID;

CREATE TABLE model_calls (
	turn_id TEXT    NOT NULL REFERENCES turns(turn_id),
	idx     INTEGER NOT NULL,
	step    INTEGER NOT NULL,
	model   TEXT    NOT NULL,
	outcome TEXT    NOT NULL,
	record  TEXT    NOT NULL,
	PRIMARY KEY (turn_id, idx)
) WITHOUT ROWID;

CREATE TABLE messages (
	id         INTEGER PRIMARY KEY AUTOINCREMENT,
	session_id TEXT NOT NULL REFERENCES sessions(session_id),
	turn_id    TEXT NOT NULL,
	message    TEXT NOT NULL
);
CREATE INDEX messages_by_session ON messages(session_id, id);
CREATE INDEX messages_by_turn    ON messages(turn_id);
`,
	// 2: what timebox stats sums up (store.CallStats), as columns of the
	// call records rather than inside their JSON, with covering indexes:
	// a million calls are read from the indexes alone. sample_ms is a
	// call's time when it enters its percentiles (store.ToolSample,
	// store.ModelSample), NULL when not; silence_ms the longest silence
	// of a tool call (store.LongestSilence), NULL when not measured.
	// Calls stored before this version are filled in from their records
	// with the rules as they are at this version; their silence is known
	// only for calls that reported no progress (it is their duration).
	`
ALTER TABLE tool_calls ADD COLUMN timeout_ms      INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tool_calls ADD COLUMN idle_timeout_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tool_calls ADD COLUMN phase           TEXT    NOT NULL DEFAULT '';
ALTER TABLE tool_calls ADD COLUMN refused         TEXT    NOT NULL DEFAULT '';
ALTER TABLE tool_calls ADD COLUMN overran         INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tool_calls ADD COLUMN abandoned       INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tool_calls ADD COLUMN progress_count  INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tool_calls ADD COLUMN sample_ms       INTEGER;
ALTER TABLE tool_calls ADD COLUMN silence_ms      INTEGER;

UPDATE tool_calls SET
	timeout_ms      = COALESCE(json_extract(record, '$.timeout_ms'), 0),
	idle_timeout_ms = COALESCE(json_extract(record, '$.idle_timeout_ms'), 0),
	phase           = COALESCE(json_extract(record, '$.phase'), ''),
	refused         = COALESCE(json_extract(record, '$.refused'), ''),
	overran         = COALESCE(json_extract(record, '$.overran'), 0),
	abandoned       = COALESCE(json_extract(record, '$.abandoned'), 0),
	progress_count  = COALESCE(json_extract(record, '$.progress_count'), 0);
UPDATE tool_calls SET sample_ms = duration_ms
	WHERE refused = '' AND outcome IN ('ok', 'error', 'timed_out', 'abandoned') AND phase IN ('', 'tool', 'tool_idle');
UPDATE tool_calls SET silence_ms = duration_ms WHERE sample_ms IS NOT NULL AND progress_count = 0;

-- Each tool's sample in order (percentiles and maxima by a walk from
-- either end), and the counts of one pass; the calls that end unusually,
-- which are few, and those that reported progress, in indexes of their
-- own; the latest call's budget. A partial index holds the columns of its
-- WHERE too: SQLite reads the table for them otherwise.
CREATE INDEX tool_calls_stats    ON tool_calls(tool, sample_ms, started_at, outcome, progress_count);
CREATE INDEX tool_calls_unusual  ON tool_calls(tool, started_at, outcome, phase, refused, overran, abandoned, sample_ms, timeout_ms, idle_timeout_ms)
	WHERE outcome NOT IN ('ok', 'error') OR overran OR abandoned OR refused <> '';
CREATE INDEX tool_calls_progress ON tool_calls(tool, started_at, silence_ms, progress_count, sample_ms)
	WHERE progress_count > 0 AND sample_ms IS NOT NULL;
CREATE INDEX tool_calls_latest   ON tool_calls(tool, started_at);

-- A call's progress events, to measure its silences as its record is
-- stored: only tool_progress events are in this index.
CREATE INDEX events_progress ON events(turn_id, at) WHERE type = 'tool_progress';

ALTER TABLE model_calls ADD COLUMN provider     TEXT    NOT NULL DEFAULT '';
ALTER TABLE model_calls ADD COLUMN started_at   INTEGER NOT NULL DEFAULT 0;
ALTER TABLE model_calls ADD COLUMN phase        TEXT    NOT NULL DEFAULT '';
ALTER TABLE model_calls ADD COLUMN sample_phase TEXT    NOT NULL DEFAULT '';
ALTER TABLE model_calls ADD COLUMN sample_ms    INTEGER;

UPDATE model_calls SET
	provider     = COALESCE(json_extract(record, '$.provider'), ''),
	started_at   = COALESCE(CAST(unixepoch(json_extract(record, '$.started_at'), 'subsec') * 1000000000 AS INTEGER), 0),
	phase        = COALESCE(json_extract(record, '$.phase'), ''),
	sample_phase = CASE WHEN json_extract(record, '$.compaction') THEN 'compaction' ELSE 'llm_first_chunk' END;
UPDATE model_calls SET sample_ms = CASE
	WHEN sample_phase = 'compaction' THEN
		CASE WHEN outcome IN ('ok', 'insufficient') OR phase = 'compaction' THEN json_extract(record, '$.stream_ms') END
	WHEN phase = 'llm_first_chunk' THEN json_extract(record, '$.stream_ms')
	WHEN outcome = 'ok' OR json_extract(record, '$.first_chunk_ms') > 0 THEN json_extract(record, '$.first_chunk_ms')
	END;

CREATE INDEX model_calls_stats   ON model_calls(provider, model, sample_phase, sample_ms, started_at, outcome);
CREATE INDEX model_calls_unusual ON model_calls(provider, model, sample_phase, started_at, outcome, phase)
	WHERE outcome NOT IN ('ok', 'insufficient');
`,
	// 3: the requests for people's decisions on tool calls, and the
	// decisions (store.Approvals). decision is '' while the call waits.
	`
CREATE TABLE approvals (
	turn_id      TEXT    NOT NULL REFERENCES turns(turn_id),
	call_id      TEXT    NOT NULL,
	round        INTEGER NOT NULL,
	n            INTEGER NOT NULL,
	tool         TEXT    NOT NULL,
	arguments    TEXT    NOT NULL DEFAULT '',
	requested_at INTEGER NOT NULL,
	expires_at   INTEGER NOT NULL,
	decision     TEXT    NOT NULL DEFAULT '',
	by_whom      TEXT    NOT NULL DEFAULT '',
	reason       TEXT    NOT NULL DEFAULT '',
	decided_at   INTEGER,
	PRIMARY KEY (turn_id, call_id, round)
) WITHOUT ROWID;
`,
	// 4: the queue of webhook deliveries (store.Deliveries): one row per
	// event and receiver, its body as sent, its lease, and its attempts as
	// a JSON list. No reference to turns: a delivery may be stored before
	// its turn's events are.
	`
CREATE TABLE webhook_deliveries (
	n               INTEGER PRIMARY KEY AUTOINCREMENT,
	id              TEXT    NOT NULL UNIQUE,
	url             TEXT    NOT NULL,
	event_type      TEXT    NOT NULL,
	turn_id         TEXT    NOT NULL DEFAULT '',
	seq             INTEGER NOT NULL DEFAULT 0,
	body            BLOB    NOT NULL,
	created_at      INTEGER NOT NULL,
	state           TEXT    NOT NULL,
	next_attempt_at INTEGER NOT NULL DEFAULT 0,
	lease_owner     TEXT    NOT NULL DEFAULT '',
	lease_until     INTEGER NOT NULL DEFAULT 0,
	attempts        TEXT    NOT NULL DEFAULT '[]'
);
CREATE INDEX webhook_deliveries_due     ON webhook_deliveries(next_attempt_at, n) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_by_turn ON webhook_deliveries(turn_id, n);
CREATE INDEX webhook_deliveries_by_state ON webhook_deliveries(state, n);
CREATE INDEX webhook_deliveries_done     ON webhook_deliveries(created_at) WHERE state <> 'pending';
`,
	// 5: suspended turns (store.Suspender): a turn whose process stopped
	// while it waited for nothing but people, with its checkpoint. Its
	// owner_id is 'suspended' meanwhile: no process owns it.
	`
CREATE TABLE suspended_turns (
	turn_id      TEXT    PRIMARY KEY REFERENCES turns(turn_id),
	checkpoint   BLOB    NOT NULL,
	suspended_at INTEGER NOT NULL
);
`,
	// 6: long texts stored once, in pieces (texts.go): a turn's answer of
	// megabytes is one text of the turn, which its turn_finished event,
	// record, message and session message name in their apart column
	// ("answer=answer,message=answer") instead of each holding a copy.
	// Rows written before keep their texts inline: an empty apart.
	`
CREATE TABLE texts (
	turn_id TEXT    NOT NULL REFERENCES turns(turn_id),
	name    TEXT    NOT NULL,
	i       INTEGER NOT NULL,
	piece   TEXT    NOT NULL,
	PRIMARY KEY (turn_id, name, i)
);
ALTER TABLE events   ADD COLUMN apart TEXT NOT NULL DEFAULT '';
ALTER TABLE turns    ADD COLUMN apart TEXT NOT NULL DEFAULT '';
ALTER TABLE messages ADD COLUMN apart TEXT NOT NULL DEFAULT '';
`,
}

// SchemaVersion is the schema version this package writes: the number of
// migrations.
const SchemaVersion = 6

// migrate brings the database to SchemaVersion, one version per
// transaction. The version is read again inside each (immediate)
// transaction, so two processes opening a new database at once do not both
// apply a step.
func migrate(ctx context.Context, db *sql.DB, path string) error {
	for {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		var v int
		if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
			tx.Rollback()
			return err
		}
		if v > len(migrations) {
			tx.Rollback()
			return fmt.Errorf("%s has schema version %d, newer than this timebox knows (%d): use a newer timebox, or another --db", path, v, len(migrations))
		}
		if v == len(migrations) {
			return tx.Rollback()
		}
		if v == 0 {
			// A new store is an empty file: one that has tables already
			// is another program's database, which timebox must not
			// write its own tables into.
			var name string
			err := tx.QueryRowContext(ctx, `SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name LIMIT 1`).Scan(&name)
			if err == nil {
				tx.Rollback()
				return fmt.Errorf("%s is a SQLite database, but not a store of timebox's (it has a table %q of its own): name the store's file, or a new one for timebox to make", path, name)
			}
			if !errors.Is(err, sql.ErrNoRows) {
				tx.Rollback()
				return err
			}
		}
		if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrating %s to version %d: %w", path, v+1, err)
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", v+1)); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migrating %s to version %d: %w", path, v+1, err)
		}
	}
}
