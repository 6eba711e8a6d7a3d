package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// migrations are the schema's versions, in order: migrations[i] takes a
// database from version i to i+1 (the largest version in timebox_schema).
// Released entries are never edited; a change is a new entry.
//
// The tables are SQLite's (store/sqlite/schema.go), column for column, so
// that both stores answer alike: times of turns and events are Unix
// nanoseconds, records are the spec's JSON as text (jsonb would refuse the
// \u0000 a tool's output may hold). What only a shared database needs is
// here too: owners' heartbeats on the database's clock, each owner's own
// heartbeat interval (a gateway is judged by its own), and cancel
// requests.
var migrations = []string{
	// 1: sessions, turns, events, call records, conversations, the
	// gateways that own running turns, and cancel requests.
	`
CREATE TABLE owners (
	owner_id     text PRIMARY KEY,
	host         text NOT NULL,
	pid          integer NOT NULL,
	heartbeat_ms bigint NOT NULL,
	started_at   timestamptz NOT NULL DEFAULT now(),
	heartbeat_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE sessions (
	n          bigint GENERATED ALWAYS AS IDENTITY,
	session_id text PRIMARY KEY,
	created_at bigint NOT NULL,
	updated_at bigint NOT NULL
);
CREATE INDEX sessions_by_update ON sessions (updated_at, n);

CREATE TABLE turns (
	n           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	turn_id     text NOT NULL UNIQUE,
	session_id  text NOT NULL DEFAULT '',
	agent       text NOT NULL DEFAULT '',
	input       text NOT NULL,
	status      text NOT NULL,
	stop_reason text NOT NULL DEFAULT '',
	message     text NOT NULL DEFAULT '',
	started_at  bigint NOT NULL,
	ended_at    bigint,
	wall_ms     bigint NOT NULL DEFAULT 0,
	steps       integer NOT NULL DEFAULT 0,
	owner_id    text NOT NULL DEFAULT '',
	record      text
);
CREATE INDEX turns_by_status      ON turns (status, n);
CREATE INDEX turns_by_stop_reason ON turns (stop_reason, n);
CREATE INDEX turns_by_session     ON turns (session_id, n);
CREATE INDEX turns_running        ON turns (owner_id) WHERE status = 'running';

CREATE TABLE events (
	turn_id text   NOT NULL REFERENCES turns (turn_id),
	seq     bigint NOT NULL,
	type    text   NOT NULL,
	at      bigint NOT NULL,
	data    text   NOT NULL,
	PRIMARY KEY (turn_id, seq)
);

CREATE TABLE tool_calls (
	turn_id     text    NOT NULL REFERENCES turns (turn_id),
	call_id     text    NOT NULL,
	tool        text    NOT NULL,
	outcome     text    NOT NULL,
	started_at  bigint  NOT NULL,
	duration_ms bigint  NOT NULL,
	late_result boolean NOT NULL DEFAULT false,
	record      text    NOT NULL,
	PRIMARY KEY (turn_id, call_id)
);

CREATE TABLE model_calls (
	turn_id text    NOT NULL REFERENCES turns (turn_id),
	idx     integer NOT NULL,
	step    integer NOT NULL,
	model   text    NOT NULL,
	outcome text    NOT NULL,
	record  text    NOT NULL,
	PRIMARY KEY (turn_id, idx)
);

CREATE TABLE messages (
	id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	session_id text NOT NULL REFERENCES sessions (session_id),
	turn_id    text NOT NULL,
	message    text NOT NULL
);
CREATE INDEX messages_by_session ON messages (session_id, id);
CREATE INDEX messages_by_turn    ON messages (turn_id);

CREATE TABLE cancel_requests (
	turn_id      text PRIMARY KEY REFERENCES turns (turn_id),
	requested_at timestamptz NOT NULL DEFAULT now()
);
`,
	// 2: the large values of turns an engine runs on other machines
	// (store.Payloads): their conversations, passed by reference; the
	// caller of such a turn (store.TurnStart.Caller) and why a cancel was
	// requested (store.CancelReasons).
	`
CREATE TABLE payloads (
	turn_id text  NOT NULL,
	key     text  NOT NULL,
	data    bytea NOT NULL,
	PRIMARY KEY (turn_id, key)
);
ALTER TABLE turns ADD COLUMN caller text NOT NULL DEFAULT '';
ALTER TABLE cancel_requests ADD COLUMN reason text NOT NULL DEFAULT '';
ALTER TABLE cancel_requests ADD COLUMN requested_by text NOT NULL DEFAULT '';
`,
	// 3: the groups of numbered events committed, by their writer's token
	// (an engine's workers number the events of a turn): a writer whose
	// commit's answer was lost — the connection cut as it committed —
	// finds here that the group was stored, and with which seqs, instead
	// of storing it twice. Kept an hour.
	`
CREATE TABLE numbered_groups (
	token text        PRIMARY KEY,
	seqs  bigint[]    NOT NULL,
	at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX numbered_groups_at ON numbered_groups (at);
`,
	// 4: what timebox stats sums up (store.CallStats), as columns of the
	// call records rather than inside their JSON, with covering indexes,
	// as in SQLite's version 2: sample_ms is a call's time when it enters
	// its percentiles (store.ToolSample, store.ModelSample), NULL when not;
	// silence_ms the longest silence of a tool call (store.LongestSilence),
	// NULL when not measured. Calls stored before this version are filled
	// in from their records with the rules as they are at this version
	// (a record holding \u0000, which PostgreSQL's json cannot give back as
	// text, keeps the defaults); their silence is known only for calls
	// that reported no progress (it is their duration).
	`
ALTER TABLE tool_calls
	ADD COLUMN timeout_ms      bigint  NOT NULL DEFAULT 0,
	ADD COLUMN idle_timeout_ms bigint  NOT NULL DEFAULT 0,
	ADD COLUMN phase           text    NOT NULL DEFAULT '',
	ADD COLUMN refused         text    NOT NULL DEFAULT '',
	ADD COLUMN overran         boolean NOT NULL DEFAULT false,
	ADD COLUMN abandoned       boolean NOT NULL DEFAULT false,
	ADD COLUMN progress_count  integer NOT NULL DEFAULT 0,
	ADD COLUMN sample_ms       bigint,
	ADD COLUMN silence_ms      bigint;

UPDATE tool_calls t SET
	timeout_ms      = COALESCE((r.j->>'timeout_ms')::bigint, 0),
	idle_timeout_ms = COALESCE((r.j->>'idle_timeout_ms')::bigint, 0),
	phase           = COALESCE(r.j->>'phase', ''),
	refused         = COALESCE(r.j->>'refused', ''),
	overran         = COALESCE((r.j->>'overran')::boolean, false),
	abandoned       = COALESCE((r.j->>'abandoned')::boolean, false),
	progress_count  = COALESCE((r.j->>'progress_count')::integer, 0)
	FROM (SELECT turn_id, call_id, record::json AS j FROM tool_calls WHERE strpos(record, '\u0000') = 0) r
	WHERE t.turn_id = r.turn_id AND t.call_id = r.call_id;
UPDATE tool_calls SET sample_ms = duration_ms
	WHERE refused = '' AND outcome IN ('ok', 'error', 'timed_out', 'abandoned') AND phase IN ('', 'tool', 'tool_idle');
UPDATE tool_calls SET silence_ms = duration_ms WHERE sample_ms IS NOT NULL AND progress_count = 0;

-- Each tool's sample in order (percentiles and maxima), and the counts of
-- one pass; the calls that end unusually, which are few, and those that
-- reported progress, in indexes of their own; the latest call's budget.
CREATE INDEX tool_calls_stats    ON tool_calls (tool, sample_ms) INCLUDE (started_at, outcome, progress_count);
CREATE INDEX tool_calls_unusual  ON tool_calls (tool, started_at)
	INCLUDE (outcome, phase, refused, overran, abandoned, sample_ms, timeout_ms, idle_timeout_ms)
	WHERE outcome NOT IN ('ok', 'error') OR overran OR abandoned OR refused <> '';
CREATE INDEX tool_calls_progress ON tool_calls (tool, started_at) INCLUDE (silence_ms) WHERE progress_count > 0 AND sample_ms IS NOT NULL;
CREATE INDEX tool_calls_latest   ON tool_calls (tool, started_at);

-- A call's progress events, to measure its silences as its record is
-- stored: only tool_progress events are in this index.
CREATE INDEX events_progress ON events (turn_id, at) WHERE type = 'tool_progress';

ALTER TABLE model_calls
	ADD COLUMN provider     text   NOT NULL DEFAULT '',
	ADD COLUMN started_at   bigint NOT NULL DEFAULT 0,
	ADD COLUMN phase        text   NOT NULL DEFAULT '',
	ADD COLUMN sample_phase text   NOT NULL DEFAULT '',
	ADD COLUMN sample_ms    bigint;

UPDATE model_calls m SET
	provider     = COALESCE(r.j->>'provider', ''),
	started_at   = COALESCE((extract(epoch FROM (r.j->>'started_at')::timestamptz) * 1000000000)::bigint, 0),
	phase        = COALESCE(r.j->>'phase', ''),
	sample_phase = CASE WHEN COALESCE((r.j->>'compaction')::boolean, false) THEN 'compaction' ELSE 'llm_first_chunk' END,
	sample_ms    = CASE
		WHEN COALESCE((r.j->>'compaction')::boolean, false) THEN
			CASE WHEN m.outcome IN ('ok', 'insufficient') OR r.j->>'phase' = 'compaction' THEN (r.j->>'stream_ms')::bigint END
		WHEN r.j->>'phase' = 'llm_first_chunk' THEN (r.j->>'stream_ms')::bigint
		WHEN m.outcome = 'ok' OR (r.j->>'first_chunk_ms')::bigint > 0 THEN (r.j->>'first_chunk_ms')::bigint
		END
	FROM (SELECT turn_id, idx, record::json AS j FROM model_calls WHERE strpos(record, '\u0000') = 0) r
	WHERE m.turn_id = r.turn_id AND m.idx = r.idx;

CREATE INDEX model_calls_stats   ON model_calls (provider, model, sample_phase, sample_ms) INCLUDE (started_at, outcome);
CREATE INDEX model_calls_unusual ON model_calls (provider, model, sample_phase, started_at) INCLUDE (outcome, phase)
	WHERE outcome NOT IN ('ok', 'insufficient');
`,
	// 5: the requests for people's decisions on tool calls, and the
	// decisions (store.Approvals), as SQLite's. decision is '' while the
	// call waits; a decision locks the call's row, so of two gateways
	// deciding at once the first wins.
	`
CREATE TABLE approvals (
	turn_id      text NOT NULL REFERENCES turns (turn_id),
	call_id      text NOT NULL,
	round        integer NOT NULL,
	n            bigint GENERATED ALWAYS AS IDENTITY,
	tool         text NOT NULL,
	arguments    text NOT NULL DEFAULT '',
	requested_at bigint NOT NULL,
	expires_at   bigint NOT NULL,
	decision     text NOT NULL DEFAULT '',
	by_whom      text NOT NULL DEFAULT '',
	reason       text NOT NULL DEFAULT '',
	decided_at   bigint,
	PRIMARY KEY (turn_id, call_id, round)
);
`,
	// 6: the queue of webhook deliveries (store.Deliveries), as SQLite's
	// version 4: one row per event and receiver, its body as sent (bytea),
	// the lease of the gateway sending it, and its attempts as JSON text.
	`
CREATE TABLE webhook_deliveries (
	n               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
	id              text   NOT NULL UNIQUE,
	url             text   NOT NULL,
	event_type      text   NOT NULL,
	turn_id         text   NOT NULL DEFAULT '',
	seq             bigint NOT NULL DEFAULT 0,
	body            bytea  NOT NULL,
	created_at      bigint NOT NULL,
	state           text   NOT NULL,
	next_attempt_at bigint NOT NULL DEFAULT 0,
	lease_owner     text   NOT NULL DEFAULT '',
	lease_until     bigint NOT NULL DEFAULT 0,
	attempts        text   NOT NULL DEFAULT '[]'
);
CREATE INDEX webhook_deliveries_due      ON webhook_deliveries (next_attempt_at, n) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_by_turn  ON webhook_deliveries (turn_id, n);
CREATE INDEX webhook_deliveries_by_state ON webhook_deliveries (state, n);
CREATE INDEX webhook_deliveries_done     ON webhook_deliveries (created_at) WHERE state <> 'pending';
`,
	// 7: suspended turns (store.Suspender), as SQLite's version 5. Their
	// owner_id is 'engine:suspended' meanwhile: no gateway owns them, and
	// none takes them for orphans.
	`
CREATE TABLE suspended_turns (
	turn_id      text PRIMARY KEY REFERENCES turns (turn_id),
	checkpoint   bytea NOT NULL,
	suspended_at bigint NOT NULL
);
`,
	// 8: long texts stored once, in pieces, as SQLite's version 6
	// (store.Apart): a turn's answer of megabytes is one text of the turn,
	// which its turn_finished event, record, message and session message
	// name in their apart column instead of each holding a copy. A piece
	// is bytea: a text column refuses NUL. Rows written before keep their
	// texts inline: an empty apart.
	`
CREATE TABLE texts (
	turn_id text    NOT NULL REFERENCES turns (turn_id),
	name    text    NOT NULL,
	i       integer NOT NULL,
	piece   bytea   NOT NULL,
	PRIMARY KEY (turn_id, name, i)
);
ALTER TABLE events   ADD COLUMN apart text NOT NULL DEFAULT '';
ALTER TABLE turns    ADD COLUMN apart text NOT NULL DEFAULT '';
ALTER TABLE messages ADD COLUMN apart text NOT NULL DEFAULT '';
`,
	// 9: the follower of a turn an engine runs (store.TurnStart.Follower):
	// the owner whose process notes its waits and ends it when no worker
	// can. A live gateway adopts the running turns whose follower has no
	// owner row (store.Followers). Turns begun before have none, and are
	// adopted.
	`
ALTER TABLE turns ADD COLUMN follower text NOT NULL DEFAULT '';
`,
}

// SchemaVersion is the schema version this package writes: the number of
// migrations.
const SchemaVersion = 9

// migrationLock is the advisory lock that serialises migrations: "timebox"
// in ASCII.
const migrationLock = 0x74696d65626f78

// migrate brings the database to SchemaVersion in one transaction, under
// an advisory lock: of gateways starting at once on a new database, one
// migrates while the others wait for it, then find nothing to do. DDL is
// transactional in PostgreSQL, so a failed migration leaves nothing half
// done.
func migrate(ctx context.Context, pool *pgxpool.Pool, where string) error {
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrationLock)); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS timebox_schema (
			version    integer PRIMARY KEY,
			applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
			return err
		}
		var v int
		if err := tx.QueryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM timebox_schema`).Scan(&v); err != nil {
			return err
		}
		if v > len(migrations) {
			return fmt.Errorf("%s has schema version %d, newer than this timebox knows (%d): use a newer timebox, or another database", where, v, len(migrations))
		}
		for ; v < len(migrations); v++ {
			if _, err := tx.Exec(ctx, migrations[v]); err != nil {
				return fmt.Errorf("migrating %s to version %d: %w", where, v+1, err)
			}
			if _, err := tx.Exec(ctx, `INSERT INTO timebox_schema (version) VALUES ($1)`, v+1); err != nil {
				return err
			}
		}
		return nil
	})
}
