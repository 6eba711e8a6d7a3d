package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/internal/groupq"
)

// Notification channels.
const (
	chanEvents = "timebox_events" // payload: a turn id whose events or status changed
	chanCancel = "timebox_cancel" // payload: a turn id a cancel was requested for
)

// BeginTurn implements store.Store. A database that answers nothing for
// hungAfter (it hangs) refuses the turn, as one that is away does
// (store.ErrUnavailable), rather than holding its client until it is
// back. When that, or a cut connection, leaves unknown whether the turn's
// COMMIT was stored (it was sent, and no answer came), the store ends the
// turn as soon as the database answers again (endUnbegun): its client was
// told it did not begin, and a turn nobody runs must not hold its session
// until this store closes.
func (s *Store) BeginTurn(ctx context.Context, t store.TurnStart) error {
	committing := false
	err := s.unlessHung(ctx, func(ctx context.Context) error {
		return s.tx(ctx, func(tx pgx.Tx) error {
			// A store that others took for gone (a long pause) is an
			// owner again before it begins anything, so that its new turn
			// is not taken for an orphan.
			if err := s.beatTx(ctx, tx); err != nil {
				return err
			}
			if err := s.begin(ctx, tx, t, true); err != nil {
				return err
			}
			if beforeBeginCommit != nil {
				beforeBeginCommit(int(tx.Conn().PgConn().PID()))
			}
			committing = true // pgx.BeginFunc commits next
			return nil
		})
	})
	if err != nil && committing && !isServerError(err) {
		s.unbegun(t.TurnID)
	}
	if err != nil && !errors.Is(err, store.ErrUnavailable) && transient(err) {
		return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return err
}

// beforeBeginCommit, in tests, is called just before BeginTurn's COMMIT
// is sent, with the pid of the backend that runs its transaction (nil:
// nothing).
var beforeBeginCommit func(backend int)

// unbegun notes turn id, whose BeginTurn failed with its COMMIT sent and
// not answered: it may be stored, running, and nobody runs it.
func (s *Store) unbegun(id string) {
	s.unbegunMu.Lock()
	defer s.unbegunMu.Unlock()
	if s.unbegunIDs == nil {
		s.unbegunIDs = map[string]bool{}
	}
	s.unbegunIDs[id] = true
}

// notBegun is the end of a turn whose BeginTurn failed after its COMMIT
// was sent, and was stored all the same.
var notBegun = store.End{Why: "the store did not answer as the turn began", Said: func(time.Duration) string {
	return "Interrupted before it began: the store did not answer as it was begun, and its client was told it could not begin (503 store_unavailable)."
}}

// endUnbegun ends, as interrupted, the turns whose BeginTurn failed with
// their COMMIT unanswered (unbegun) and that were stored all the same;
// those that were not stored are forgotten. The heartbeat calls it once
// the database answers; a turn it cannot end yet is tried again at the
// next heartbeat, and Close marks it interrupted with the others.
//
// The turn's row is looked for only once its BeginTurn's transaction has
// ended, committed or not: that transaction renewed the store's owner row
// first (beatTx) and holds it, so the heartbeat that calls this waits for
// it, however long its backend takes to read the COMMIT.
func (s *Store) endUnbegun(ctx context.Context) {
	s.unbegunMu.Lock()
	ids := slices.Collect(maps.Keys(s.unbegunIDs))
	s.unbegunMu.Unlock()
	for _, id := range ids {
		var ended *store.Ending
		err := s.tx(ctx, func(tx pgx.Tx) error {
			var err error
			ended, err = s.interruptTurn(ctx, tx, id, notBegun, false)
			if isNoRows(err) {
				return nil // not stored: nothing to end
			}
			return err
		})
		if err != nil {
			continue
		}
		s.unbegunMu.Lock()
		delete(s.unbegunIDs, id)
		s.unbegunMu.Unlock()
		if ended != nil {
			s.endedOutside(*ended)
			s.log.Info("postgres store: marked interrupted a turn stored as it began although the store did not answer its client (it was refused 503)",
				"db", s.where, "turn_id", id)
		}
	}
}

// begin inserts a running turn owned by s; exclusive refuses it while its
// session has another turn running (store.ErrSessionBusy).
func (s *Store) begin(ctx context.Context, tx pgx.Tx, t store.TurnStart, exclusive bool) error {
	var one int
	switch err := tx.QueryRow(ctx, `SELECT 1 FROM turns WHERE turn_id = $1`, t.TurnID).Scan(&one); {
	case err == nil:
		return fmt.Errorf("turn %s: %w", t.TurnID, store.ErrExists)
	case !isNoRows(err):
		return err
	}
	if t.StartedAt.IsZero() {
		t.StartedAt = time.Now()
	}
	if t.SessionID != "" {
		// Touching the session locks its row: two gateways beginning a
		// turn in one session at once take turns here, and the second
		// sees the first's turn below.
		if err := touchSession(ctx, tx, t.SessionID, t.StartedAt); err != nil {
			return err
		}
		if exclusive {
			var busy string
			switch err := tx.QueryRow(ctx, `SELECT turn_id FROM turns WHERE session_id = $1 AND status = 'running' LIMIT 1`,
				t.SessionID).Scan(&busy); {
			case err == nil:
				return fmt.Errorf("session %s: %w (%s)", t.SessionID, store.ErrSessionBusy, busy)
			case !isNoRows(err):
				return err
			}
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO turns (turn_id, session_id, agent, input, status, started_at, owner_id, caller, follower)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`, t.TurnID, t.SessionID, text(t.Agent), text(t.Input), budget.StatusRunning,
		nanos(t.StartedAt), ownerOf(s.owner, t.Engine), t.Caller, t.Follower)
	if isUnique(err) {
		return fmt.Errorf("turn %s: %w", t.TurnID, store.ErrExists)
	}
	return err
}

// enginePrefix marks the owner of a turn an engine runs (store.TurnStart.Engine):
// no owner row, and no store takes it for an orphan.
const enginePrefix = "engine:"

// ownerOf returns the owner_id of a turn begun by owner for engine.
func ownerOf(owner, engine string) string {
	if engine != "" {
		return enginePrefix + engine
	}
	return owner
}

func touchSession(ctx context.Context, tx pgx.Tx, id string, at time.Time) error {
	_, err := tx.Exec(ctx, `INSERT INTO sessions (session_id, created_at, updated_at) VALUES ($1, $2, $2)
		ON CONFLICT (session_id) DO UPDATE SET updated_at = GREATEST(sessions.updated_at, excluded.updated_at)`, id, nanos(at))
	return err
}

func isUnique(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23505"
}

func isFK(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "23503"
}

// AppendEvent implements store.Store: it queues e and waits for the
// commit of its group.
func (s *Store) AppendEvent(ctx context.Context, e event.Event) error {
	done := make(chan error, 1)
	s.QueueEvent(e, func(err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// QueueEvent implements store.Store.
func (s *Store) QueueEvent(e event.Event, committed func(error)) {
	s.q.Add(e, func(err error) {
		if err == nil {
			s.watch.Wake(e.TurnID)
		}
		if committed != nil {
			committed(err)
		}
	})
}

// Flush implements store.Store.
func (s *Store) Flush(ctx context.Context) error { return s.q.Flush(ctx) }

// appendEventsSQL inserts a group of events, of running turns only, and
// notifies each turn it stored events of (PostgreSQL delivers one
// notification per turn and transaction, at commit). The turns are locked
// (FOR KEY SHARE) first, so that a store marking one of them interrupted —
// which locks it FOR UPDATE — either waits for this group and then sees its
// events, or ends the turn before it and the group's events of that turn
// are refused: no event ever lands after the turn_finished of an
// interruption.
const appendEventsSQL = `
WITH live AS (
	SELECT turn_id FROM turns WHERE turn_id = ANY($1::text[]) AND status = 'running' FOR KEY SHARE
), ins AS (
	INSERT INTO events (turn_id, seq, type, at, data, apart)
	SELECT u.turn_id, u.seq, u.type, u.at, u.data, u.apart
		FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[], $7::text[]) AS u(turn_id, seq, type, at, data, apart)
		WHERE u.turn_id IN (SELECT turn_id FROM live)
	ON CONFLICT (turn_id, seq) DO NOTHING
	RETURNING turn_id, seq
)
SELECT turn_id, seq, pg_notify($6, turn_id) FROM ins`

type turnSeq struct {
	turn string
	seq  int64
}

// querier is a pool or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// commitGroup writes a group of appends: the events, the call records they
// carry, and a notification per turn. A group without call records — most
// of them: stream deltas, progress — is one statement, committed on its
// own (one round trip to the database); one with records is a transaction
// that stores them with their events.
func (s *Store) commitGroup(group []*groupq.Item) (err error) {
	ctx := s.ctx
	if s.isClosed() {
		// Close drains the queue after it stopped the background context.
		ctx = context.Background()
	}
	numbered, records := false, false
	for _, it := range group {
		numbered = numbered || it.Event.Seq == 0
		// An event with long texts is stored in a transaction that finds
		// them stored (prestore), or stores them.
		_, long := store.StoredEvent(it.Event)
		records = records || store.WaitForStore(it.Event) || len(long) > 0
	}
	if !numbered && !records {
		stored, err := insertGroup(ctx, s.pool, group)
		if err != nil {
			return err
		}
		if len(stored) < len(group) {
			return s.explainUnstored(ctx, s.pool, group, stored)
		}
		return nil
	}
	if numbered {
		// number gives events their seqs in the transaction: a failed one
		// leaves them unnumbered again, for the queue to commit again
		// under the turn's lock, never with a seq another writer may have
		// taken meanwhile.
		type unnumbered struct {
			it   *groupq.Item
			data []byte
		}
		var orig []unnumbered
		for _, it := range group {
			if it.Event.Seq == 0 {
				orig = append(orig, unnumbered{it, it.Data})
			}
		}
		defer func() {
			if err != nil {
				for _, o := range orig {
					o.it.Event.Seq, o.it.Data = 0, o.data
				}
			}
		}()
	}
	if numbered && group[0].Token == "" {
		group[0].Token = newID()
	}
	// Long texts first, each piece committed on its own (prestore).
	for _, it := range group {
		if _, a := store.StoredEvent(it.Event); len(a) > 0 {
			if err := s.prestore(ctx, it.Event.TurnID, a); err != nil {
				return err
			}
		}
	}
	defer func() {
		if err == nil && numbered && s.loseAnswers.Load() > 0 && s.loseAnswers.Add(-1) >= 0 {
			err = fmt.Errorf("committing: %w", io.ErrUnexpectedEOF)
		}
	}()
	return pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if numbered {
			done, err := committedBefore(ctx, tx, group)
			if done || err != nil {
				return err
			}
			all := group
			if group, err = number(ctx, tx, group); err != nil {
				return err
			}
			if err := noteCommitted(ctx, tx, all); err != nil {
				return err
			}
		}
		stored, err := insertGroup(ctx, tx, group)
		if err != nil {
			return err
		}
		b := newBatch(tx)
		for _, it := range group {
			e := it.Event
			if !stored[turnSeq{e.TurnID, e.Seq}] {
				continue
			}
			if _, a := store.StoredEvent(e); len(a) > 0 {
				if err := putTexts(ctx, tx, e.TurnID, a); err != nil {
					return err
				}
			}
			tc, mc := store.CallRecords(e)
			if tc != nil {
				if err := queueToolCall(ctx, b, *tc); err != nil {
					return err
				}
			}
			if mc != nil {
				if err := queueModelCall(&b.Batch, e.TurnID, *mc); err != nil {
					return err
				}
			}
		}
		if err := b.send(ctx); err != nil {
			return err
		}
		if len(stored) < len(group) {
			return s.explainUnstored(ctx, tx, group, stored)
		}
		return nil
	})
}

// insertGroup inserts a group's events (appendEventsSQL) and returns those
// it stored.
func insertGroup(ctx context.Context, q querier, group []*groupq.Item) (map[turnSeq]bool, error) {
	n := len(group)
	ids, seqs, types, ats := make([]string, n), make([]int64, n), make([]string, n), make([]int64, n)
	datas, aparts := make([]string, n), make([]string, n)
	for i, it := range group {
		e := it.Event
		_, a := store.StoredEvent(e)
		ids[i], seqs[i], types[i], ats[i], datas[i], aparts[i] = e.TurnID, e.Seq, string(e.Type), nanos(e.At), string(it.Data), a.Column()
	}
	rows, err := q.Query(ctx, appendEventsSQL, ids, seqs, types, ats, datas, chanEvents, aparts)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	stored := make(map[turnSeq]bool, n)
	for rows.Next() {
		var k turnSeq
		if err := rows.Scan(&k.turn, &k.seq, nil); err != nil {
			return nil, err
		}
		stored[k] = true
	}
	return stored, rows.Err()
}

// number gives each event of the group with seq 0 its turn's next seq
// (store.Store.AppendEvent). Each such turn is locked (FOR UPDATE) until
// the group commits, so groups written by several processes for one turn
// take their numbers in the order they commit: a follower reading the
// turn's events after a seq never misses one committed later with a
// smaller seq. Under the same lock, an event that ends what the turn has
// already ended (store.SameEnd: a second record of one call) is refused
// with store.ErrExists; number returns the group without those.
func number(ctx context.Context, tx pgx.Tx, group []*groupq.Item) ([]*groupq.Item, error) {
	var ids []string
	next := map[string]int64{}
	for _, it := range group {
		if id := it.Event.TurnID; it.Event.Seq == 0 {
			if _, ok := next[id]; !ok {
				next[id] = 0
				ids = append(ids, id)
			}
		}
	}
	// The lock first, then the last seq in a statement of its own: a
	// statement that waited for a lock still reads with the snapshot it
	// began with, and would miss the seqs of the group it waited for.
	if _, err := tx.Exec(ctx, `SELECT 1 FROM turns WHERE turn_id = ANY($1::text[]) ORDER BY turn_id FOR UPDATE`, ids); err != nil {
		return nil, err
	}
	rows, err := tx.Query(ctx, `SELECT turn_id, max(seq) FROM events WHERE turn_id = ANY($1::text[]) GROUP BY turn_id`, ids)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id string
		var last int64
		if err := rows.Scan(&id, &last); err != nil {
			rows.Close()
			return nil, err
		}
		next[id] = last
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// Events of the group that carry their own seq come first.
	for _, it := range group {
		if last, ok := next[it.Event.TurnID]; ok && it.Event.Seq > last {
			next[it.Event.TurnID] = it.Event.Seq
		}
	}
	keep := group[:0:0]
	var seen []event.Event // the ends of this group, numbered
	for _, it := range group {
		e := it.Event
		if e.Seq == 0 && endsSomething(e) {
			dup, err := endedBefore(ctx, tx, e, seen)
			if err != nil {
				return nil, err
			}
			if dup {
				it.Err = fmt.Errorf("turn %s: a second %s for the same thing: %w", e.TurnID, e.Type, store.ErrExists)
				continue
			}
			seen = append(seen, e)
		}
		keep = append(keep, it)
		if e.Seq != 0 {
			continue
		}
		next[e.TurnID]++
		it.Event.Seq = next[e.TurnID]
		// As the queue encodes an event (store.EncodeEvent): its long
		// texts apart, and without json.Marshal's copies.
		d, err := store.EncodeEvent(it.Event)
		if err != nil {
			return nil, err
		}
		it.Data = d
	}
	return keep, nil
}

// committedBefore reports whether the numbered group was committed by an
// earlier attempt whose answer was lost, and if so gives its events the
// seqs they were stored with (an event the attempt refused as a second
// end gets ErrExists again).
func committedBefore(ctx context.Context, tx pgx.Tx, group []*groupq.Item) (bool, error) {
	var seqs []int64
	err := tx.QueryRow(ctx, `SELECT seqs FROM numbered_groups WHERE token = $1`, group[0].Token).Scan(&seqs)
	if isNoRows(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if len(seqs) != len(group) {
		return false, fmt.Errorf("postgres store: group %s was committed with %d events, is %d now", group[0].Token, len(seqs), len(group))
	}
	for i, it := range group {
		switch {
		case seqs[i] == 0:
			it.Err = fmt.Errorf("turn %s: a second %s for the same thing: %w", it.Event.TurnID, it.Event.Type, store.ErrExists)
		case it.Event.Seq == 0:
			it.Event.Seq = seqs[i]
			d, err := json.Marshal(it.Event)
			if err != nil {
				return false, err
			}
			it.Data = d
		}
	}
	return true, nil
}

// noteCommitted records the seqs number gave the group (0 for an event it
// refused), under the group's token, in the group's transaction.
func noteCommitted(ctx context.Context, tx pgx.Tx, group []*groupq.Item) error {
	seqs := make([]int64, len(group))
	for i, it := range group {
		if it.Err == nil {
			seqs[i] = it.Event.Seq
		}
	}
	_, err := tx.Exec(ctx, `INSERT INTO numbered_groups (token, seqs) VALUES ($1, $2)`, group[0].Token, seqs)
	return err
}

// endsSomething reports whether e ends a call, an attempt, a compaction or
// the turn (store.SameEnd).
func endsSomething(e event.Event) bool {
	switch e.Type {
	case event.TypeToolFinished, event.TypeLLMFinished, event.TypeCompactionFinished, event.TypeTurnFinished:
		return true
	}
	return false
}

// endedBefore reports whether what e ends was ended before: by an event of
// the same group, or one stored.
func endedBefore(ctx context.Context, tx pgx.Tx, e event.Event, group []event.Event) (bool, error) {
	for _, g := range group {
		if g.TurnID == e.TurnID && store.SameEnd(g, e) {
			return true, nil
		}
	}
	var n int
	var err error
	switch d := e.Data.(type) {
	case *event.ToolFinished:
		err = tx.QueryRow(ctx, `SELECT count(*) FROM tool_calls WHERE turn_id = $1 AND call_id = $2`, e.TurnID, d.CallID).Scan(&n)
	case *event.TurnFinished:
		err = tx.QueryRow(ctx, `SELECT count(*) FROM events WHERE turn_id = $1 AND type = 'turn_finished'`, e.TurnID).Scan(&n)
	case *event.LLMFinished, *event.CompactionFinished:
		// A compaction's record is stored among the model calls.
		_, mc := store.CallRecords(e)
		if mc == nil {
			return false, nil // a compaction_finished without a record (store.SameEnd)
		}
		rows, qerr := tx.Query(ctx, `SELECT record FROM model_calls WHERE turn_id = $1 AND step = $2`, e.TurnID, mc.Step)
		if qerr != nil {
			return false, qerr
		}
		recs, qerr := pgx.CollectRows(rows, pgx.RowTo[string])
		if qerr != nil {
			return false, qerr
		}
		for _, r := range recs {
			var stored event.ModelCall
			if json.Unmarshal([]byte(r), &stored) == nil && store.SameModelCall(stored, *mc) {
				n++
			}
		}
	}
	return n > 0, err
}

// explainUnstored sets the error of each event of the group that was not
// stored: its turn is unknown (store.ErrNotFound) or no longer running
// (store.ErrNotRunning: another store marked it interrupted). An event
// whose seq was already stored is no error: appends are idempotent.
func (s *Store) explainUnstored(ctx context.Context, tx querier, group []*groupq.Item, stored map[turnSeq]bool) error {
	var ids []string
	for _, it := range group {
		if !stored[turnSeq{it.Event.TurnID, it.Event.Seq}] {
			ids = append(ids, it.Event.TurnID)
		}
	}
	rows, err := tx.Query(ctx, `SELECT turn_id, status FROM turns WHERE turn_id = ANY($1::text[])`, ids)
	if err != nil {
		return err
	}
	status := map[string]string{}
	for rows.Next() {
		var id, st string
		if err := rows.Scan(&id, &st); err != nil {
			rows.Close()
			return err
		}
		status[id] = st
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, it := range group {
		id := it.Event.TurnID
		if stored[turnSeq{id, it.Event.Seq}] {
			continue
		}
		switch st, ok := status[id]; {
		case !ok:
			it.Err = fmt.Errorf("turn %s: %w", id, store.ErrNotFound)
		case st != string(budget.StatusRunning):
			it.Err = fmt.Errorf("turn %s is %s already (another timebox process marked it so): %w", id, st, store.ErrNotRunning)
		}
	}
	return nil
}

// toolCallSQL stores a tool call record. The WHERE keeps a late result
// (store.KeepLate) that the turn's final record, written after it, does
// not know of.
const toolCallSQL = `INSERT INTO tool_calls (turn_id, call_id, tool, outcome, started_at, duration_ms, late_result, record,
		timeout_ms, idle_timeout_ms, phase, refused, overran, abandoned, progress_count, sample_ms, silence_ms)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17)
	ON CONFLICT (turn_id, call_id) DO UPDATE SET tool = excluded.tool, outcome = excluded.outcome,
		started_at = excluded.started_at, duration_ms = excluded.duration_ms,
		late_result = excluded.late_result, record = excluded.record,
		timeout_ms = excluded.timeout_ms, idle_timeout_ms = excluded.idle_timeout_ms, phase = excluded.phase,
		refused = excluded.refused, overran = excluded.overran, abandoned = excluded.abandoned,
		progress_count = excluded.progress_count, sample_ms = excluded.sample_ms, silence_ms = excluded.silence_ms
	WHERE NOT (tool_calls.late_result AND NOT excluded.late_result)`

// toolCallArgs returns toolCallSQL's arguments for tc, and the size of its
// record's JSON among them. A call that
// reported progress has its progress events read through q (a transaction
// that has stored them), to measure its silences.
func toolCallArgs(ctx context.Context, q querier, tc event.ToolCall) (args []any, size int, err error) {
	rec, err := json.Marshal(tc)
	if err != nil {
		return nil, 0, err
	}
	var sample, silence *int64
	if ms, ok := store.ToolSample(tc); ok {
		var reports []time.Time
		if tc.ProgressCount > 0 {
			rows, err := q.Query(ctx, `SELECT at FROM events WHERE turn_id = $1 AND type = 'tool_progress' AND strpos(data, $2) > 0`,
				tc.TurnID, store.ProgressPattern(tc.CallID))
			if err != nil {
				return nil, 0, err
			}
			ats, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				return nil, 0, err
			}
			for _, at := range ats {
				reports = append(reports, fromNanos(at))
			}
		}
		quiet := store.ToolSilence(tc, reports)
		sample, silence = &ms, &quiet
	}
	return []any{tc.TurnID, text(tc.CallID), text(tc.Tool), string(tc.Outcome), nanos(tc.StartedAt), tc.DurationMS,
		tc.LateResult, string(rec), tc.TimeoutMS, tc.IdleTimeoutMS, string(tc.Phase), text(tc.Refused), tc.Overran, tc.Abandoned,
		tc.ProgressCount, sample, silence}, len(rec), nil
}

// queueToolCall queues tc's record in b, which sends it with what was
// queued before it once b holds maxBatch bytes of records.
func queueToolCall(ctx context.Context, b *batch, tc event.ToolCall) error {
	args, size, err := toolCallArgs(ctx, b.tx, tc)
	if err != nil {
		return err
	}
	return b.queueSized(ctx, size, toolCallSQL, args...)
}

const modelCallSQL = `INSERT INTO model_calls (turn_id, idx, step, model, outcome, record, provider, started_at, phase, sample_phase, sample_ms)
	VALUES ($1, (SELECT COALESCE(MAX(idx), -1) + 1 FROM model_calls WHERE turn_id = $1), $2, $3, $4, $5, $6, $7, $8, $9, $10)`

func queueModelCall(b *pgx.Batch, turnID string, mc event.ModelCall) error {
	rec, err := json.Marshal(mc)
	if err != nil {
		return err
	}
	phase, ms, ok := store.ModelSample(mc)
	var sample *int64
	if ok {
		sample = &ms
	}
	b.Queue(modelCallSQL, turnID, mc.Step, text(mc.Model), string(mc.Outcome), string(rec),
		text(mc.Provider), nanos(mc.StartedAt), string(mc.Phase), string(phase), sample)
	return nil
}

// FinishTurn implements store.Store. A turn another store has marked
// interrupted meanwhile (it took this one for gone) keeps that record:
// FinishTurn returns an error wrapping store.ErrNotRunning, and stores
// nothing.
func (s *Store) FinishTurn(ctx context.Context, rec *event.Turn, msgs []model.Message) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	s.ending.begin() // from the Flush on: Close waits for it
	defer s.ending.end()
	if err := s.Flush(ctx); err != nil {
		return err
	}
	defer s.watch.Wake(rec.TurnID)
	// The long texts of the end — the record's, the session messages' —
	// first, each piece committed on its own (prestore).
	_, texts := store.RecordApart(rec)
	if rec.SessionID != "" {
		for i, m := range msgs {
			_, a := store.MessageApart(m, i, rec.Answer)
			texts = append(texts, a...)
		}
	}
	before := func() error { return s.prestore(ctx, rec.TurnID, texts) }
	return s.durableAfter(ctx, "the record of turn "+rec.TurnID, before, func(tx pgx.Tx) error {
		var status string
		err := tx.QueryRow(ctx, `SELECT status FROM turns WHERE turn_id = $1 FOR UPDATE`, rec.TurnID).Scan(&status)
		switch {
		case isNoRows(err):
			err = s.begin(ctx, tx, store.TurnStart{TurnID: rec.TurnID, SessionID: rec.SessionID, Agent: rec.Agent,
				Input: rec.Input, StartedAt: rec.StartedAt}, false)
		case err == nil && status == string(budget.StatusInterrupted):
			return fmt.Errorf("turn %s was marked interrupted by another timebox process (it took this one for gone) before it ended; its record says so: %w",
				rec.TurnID, store.ErrNotRunning)
		}
		if err != nil {
			return err
		}
		// The events the queue did not store (a record may list events no
		// sink saw), before the calls whose silences they measure. Only
		// those are marshalled: as a rule none, and a turn's log may hold a
		// long reply's every delta (issue 29).
		w, err := storeMissing(ctx, tx, rec)
		if err != nil {
			return err
		}
		// The call records the queue stored as they are now are not
		// written again: as a rule, all of them (store.EndOf).
		b := newBatch(tx)
		for _, tc := range w.ToolCalls {
			tc.TurnID = rec.TurnID
			if err := queueToolCall(ctx, b, tc); err != nil {
				return err
			}
		}
		if w.ModelCalls {
			b.Queue(`DELETE FROM model_calls WHERE turn_id = $1`, rec.TurnID)
			for _, mc := range rec.ModelCalls {
				if err := queueModelCall(&b.Batch, rec.TurnID, mc); err != nil {
					return err
				}
			}
		}
		if err := putRecord(ctx, tx, &b.Batch, rec); err != nil {
			return err
		}
		b.Queue(`DELETE FROM cancel_requests WHERE turn_id = $1`, rec.TurnID)
		if rec.SessionID != "" {
			b.Queue(`INSERT INTO sessions (session_id, created_at, updated_at) VALUES ($1, $2, $2)
				ON CONFLICT (session_id) DO UPDATE SET updated_at = GREATEST(sessions.updated_at, excluded.updated_at)`,
				rec.SessionID, nanos(rec.EndedAt))
			b.Queue(`DELETE FROM messages WHERE turn_id = $1`, rec.TurnID)
			if len(msgs) > 0 {
				msgJSON, aparts := make([]string, len(msgs)), make([]string, len(msgs))
				for i, m := range msgs {
					m, a := store.MessageApart(m, i, rec.Answer)
					if err := putTexts(ctx, tx, rec.TurnID, a); err != nil {
						return err
					}
					j, err := json.Marshal(m)
					if err != nil {
						return err
					}
					msgJSON[i], aparts[i] = string(j), a.Column()
				}
				b.Queue(`INSERT INTO messages (session_id, turn_id, message, apart)
					SELECT $1, $2, m, a FROM unnest($3::text[], $4::text[]) WITH ORDINALITY AS u(m, a, i) ORDER BY i`,
					rec.SessionID, rec.TurnID, msgJSON, aparts)
			}
		}
		b.Queue(`SELECT pg_notify($1, $2)`, chanEvents, rec.TurnID)
		return b.send(ctx)
	})
}

// storeMissing stores the events of rec's log that the turn's store does
// not have, their long texts apart, and returns what else the end must
// write (store.EndOf).
func storeMissing(ctx context.Context, tx pgx.Tx, rec *event.Turn) (store.EndWrites, error) {
	var have []int64
	if len(rec.Events) > 0 {
		rows, err := tx.Query(ctx, `SELECT seq FROM events WHERE turn_id = $1 ORDER BY seq`, rec.TurnID)
		if err != nil {
			return store.EndWrites{}, err
		}
		if have, err = pgx.CollectRows(rows, pgx.RowTo[int64]); err != nil {
			return store.EndWrites{}, err
		}
	}
	w := store.EndOf(rec, have)
	if len(w.Events) == 0 {
		return w, nil
	}
	n := len(w.Events)
	ids, seqs, types, ats := make([]string, 0, n), make([]int64, 0, n), make([]string, 0, n), make([]int64, 0, n)
	datas, aparts := make([]string, 0, n), make([]string, 0, n)
	for _, e := range w.Events {
		c, a := store.StoredEvent(e)
		d, err := event.Marshal(c)
		if err != nil {
			return w, err
		}
		if err := putTexts(ctx, tx, rec.TurnID, a); err != nil {
			return w, err
		}
		ids, seqs, types, ats = append(ids, rec.TurnID), append(seqs, e.Seq), append(types, string(e.Type)), append(ats, nanos(e.At))
		datas, aparts = append(datas, string(d)), append(aparts, a.Column())
	}
	_, err := tx.Exec(ctx, `INSERT INTO events (turn_id, seq, type, at, data, apart)
		SELECT * FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::text[], $6::text[])
		ON CONFLICT (turn_id, seq) DO NOTHING`, ids, seqs, types, ats, datas, aparts)
	return w, err
}

// UpdateToolCall implements store.Store.
func (s *Store) UpdateToolCall(ctx context.Context, rec event.ToolCall) error {
	return s.durable(ctx, "a late result of turn "+rec.TurnID, func(tx pgx.Tx) error {
		args, _, err := toolCallArgs(ctx, tx, rec)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, toolCallSQL, args...)
		if isFK(err) {
			return fmt.Errorf("turn %s: %w", rec.TurnID, store.ErrNotFound)
		}
		return err
	})
}
