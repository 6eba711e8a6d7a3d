package postgres

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
)

// beatSQL registers an owner or renews its heartbeat; it returns the
// database's time and the heartbeat it replaced (NULL for a new row).
const beatSQL = `WITH prev AS (SELECT heartbeat_at FROM owners WHERE owner_id = $1)
	INSERT INTO owners (owner_id, host, pid, heartbeat_ms) VALUES ($1, $2, $3, $4)
	ON CONFLICT (owner_id) DO UPDATE SET heartbeat_at = now()
	RETURNING now(), (SELECT heartbeat_at FROM prev)`

// judgeIsFresh is the condition, in a judge's statements, that the
// judge's own last heartbeat ($5 its owner id) is at most freshBeats ($4)
// of its intervals old, on the statement's clock: a judge whose statement
// waited for a database that hung must not take the others' heartbeats,
// which waited as long, for their silence.
const judgeIsFresh = `EXISTS (SELECT 1 FROM owners me WHERE me.owner_id = $5
	AND me.heartbeat_at >= now() - make_interval(secs => $4 * me.heartbeat_ms / 1000.0))`

// freshBeats is how many of its own intervals a store's last heartbeat
// may be old while it judges others, and the longest gap between two of
// its heartbeats that does not start its window again. A database that
// hangs (a frozen VM, a stalled disk) fails no heartbeat: each waits, and
// is answered when it is back, as late as the others'.
const freshBeats = 1.5

// beat registers s as an owner, or renews its heartbeat, and notes that it
// sees the database (seen). After a pause so long that another store took
// it for gone (and deleted its row), it is an owner again: its old turns
// were marked interrupted — the server ends them as recorded — and it says
// so; its new turns are its own.
func (s *Store) beat(ctx context.Context) error {
	var (
		now  time.Time
		prev *time.Time
	)
	err := s.pool.QueryRow(ctx, beatSQL, s.owner, s.host, os.Getpid(), s.hb.Milliseconds()).Scan(&now, &prev)
	if err != nil {
		s.upMu.Lock()
		s.upSince = time.Time{}
		s.upMu.Unlock()
		return err
	}
	s.live.answered()
	if prev == nil && s.beatenOnce() {
		s.log.Warn("postgres store: another timebox process sharing the database took this one for gone (its heartbeats were not seen for three of its intervals) and marked its running turns interrupted; they end here as recorded there",
			"db", s.where, "owner", s.owner)
	}
	s.beaten(now, prev)
	return nil
}

func (s *Store) beatTx(ctx context.Context, tx pgx.Tx) error {
	var (
		now  time.Time
		prev *time.Time
	)
	if err := tx.QueryRow(ctx, beatSQL, s.owner, s.host, os.Getpid(), s.hb.Milliseconds()).Scan(&now, &prev); err != nil {
		return err
	}
	s.beaten(now, prev)
	return nil
}

func (s *Store) beatenOnce() bool {
	s.upMu.Lock()
	defer s.upMu.Unlock()
	return s.beatOnce
}

// beaten notes a heartbeat stored at now that replaced prev (nil: none).
// A heartbeat after a gap of more than freshBeats intervals starts the
// store's window again, as a failed one does: the database did not answer
// in between, and the others' heartbeats waited as its did.
func (s *Store) beaten(now time.Time, prev *time.Time) {
	s.upMu.Lock()
	defer s.upMu.Unlock()
	if prev == nil || now.Sub(*prev) > time.Duration(freshBeats*float64(s.hb)) {
		s.upSince = now
	}
	if s.upSince.IsZero() {
		s.upSince = now
	}
	s.beatOnce = true
}

// seen returns since when, on the database's clock, this store has seen
// the database without a failed heartbeat or a gap between two; false
// when its last one failed.
//
// A store judges another gone only once it has itself seen the database
// for a full window of the other's heartbeats, and while its own last
// heartbeat is fresh (freshBeats): after an outage every heartbeat is old,
// and the first store back would otherwise take every other for gone
// (docs/decisions/store-outages.md).
func (s *Store) seen() (time.Time, bool) {
	s.upMu.Lock()
	defer s.upMu.Unlock()
	return s.upSince, !s.upSince.IsZero()
}

// heartbeat renews the owner row and looks for gone owners every
// Options.Heartbeat until the store closes.
func (s *Store) heartbeat() {
	defer s.bg.Done()
	t := time.NewTicker(s.hb)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			// Errors here are transient (the database is away) or will
			// show on the next real write; the next tick tries again.
			if s.beat(s.ctx) == nil {
				s.endUnbegun(s.ctx)
				_, _ = s.recover(s.ctx)
				// The tokens of numbered groups are needed while their
				// writer may commit them again: minutes at most.
				_, _ = s.pool.Exec(s.ctx, `DELETE FROM numbered_groups WHERE at < now() - interval '1 hour'`)
			}
		}
	}
}

// recover marks interrupted the running turns of every owner that is gone
// — silent for Heartbeats of its own intervals, on the database's clock —
// and of turns whose owner has no row; it returns their ids.
//
// Each gone owner is claimed by deleting its row, in the transaction that
// interrupts its turns: of stores racing for it, one deletes the row and
// the others find none, so its turns are interrupted exactly once. A
// failed transaction leaves the row, for the next heartbeat to try again.
func (s *Store) recover(ctx context.Context) ([]string, error) {
	var ids []string
	since, seen := s.seen()
	var gone []string
	if seen {
		var err error
		gone, err = queryStrings(ctx, s.pool, `SELECT owner_id FROM owners
			WHERE owner_id <> $1 AND heartbeat_at < now() - make_interval(secs => $2 * heartbeat_ms / 1000.0)
			AND $3::timestamptz < now() - make_interval(secs => $2 * heartbeat_ms / 1000.0) AND `+judgeIsFresh,
			s.owner, Heartbeats, since, freshBeats, s.owner)
		if err != nil {
			return nil, err
		}
	}
	for _, o := range gone {
		got, err := s.claim(ctx, o, since)
		if err != nil {
			return ids, err
		}
		ids = append(ids, got...)
	}
	// Turns whose owner row is missing: their store crashed before it
	// registered, or was removed without marking them.
	// A turn an engine runs has no owner row, and is not an orphan.
	orphans, err := queryStrings(ctx, s.pool, `SELECT t.turn_id FROM turns t WHERE t.status = 'running'
		AND NOT starts_with(t.owner_id, $1)
		AND `+ownerGone("t.owner_id")+` ORDER BY t.n`, enginePrefix)
	if err != nil {
		return ids, err
	}
	// Turns an engine runs for a client whose process went without a row
	// (it crashed before it registered, or was removed): cancelled as
	// client_gone.
	if err := s.tx(ctx, func(tx pgx.Tx) error {
		callers, err := queryStrings(ctx, tx, `SELECT DISTINCT t.caller FROM turns t WHERE t.status = 'running' AND t.caller <> ''
			AND `+ownerGone("t.caller")+`
			AND NOT EXISTS (SELECT 1 FROM cancel_requests c WHERE c.turn_id = t.turn_id)`)
		if err != nil {
			return err
		}
		for _, c := range callers {
			if err := cancelCalledTx(ctx, tx, c, "the timebox process following it for its client, which is gone"); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return ids, err
	}
	for _, id := range orphans {
		var ended *store.Ending
		err := s.tx(ctx, func(tx pgx.Tx) error {
			var err error
			ended, err = s.interruptTurn(ctx, tx, id, store.End{Why: "the timebox process running it stopped"}, true)
			return err
		})
		if err != nil {
			return ids, err
		}
		if ended != nil {
			s.endedOutside(*ended)
			s.log.Info("marked a turn interrupted: its owner is unknown", "turn_id", id)
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// ownerGone is the condition, in a statement, that the owner named by
// column col is gone: it has no row, because its store closed, or because
// a store that took it for gone (recover, with the rules of claim) deleted
// it, or because it never registered. The turns it owned are then
// orphans, the turns it was the caller of are cancelled, and those it
// followed are adopted (AdoptTurns): one rule for the three.
func ownerGone(col string) string {
	return `NOT EXISTS (SELECT 1 FROM owners o WHERE o.owner_id = ` + col + `)`
}

// AdoptTurns implements store.Followers. A turn is claimed by a
// compare-and-set of its follower: the statement sets it to this store's
// owner only where it is still the one found gone, so that of stores
// adopting at once one changes it and the others, rechecking the row once
// the first committed, find another follower there. (A FOR UPDATE SKIP
// LOCKED select, as webhook deliveries are claimed with, rechecks the row
// it waited for against its gone owner, and adopted a turn twice: the
// anti-join with owners is not rechecked.) The claim is then the owner row
// of its follower: it passes on when that row goes (ownerGone). The
// adopter's own heartbeat must be fresh (judgeIsFresh), so that its row
// is there for the others to see it live.
func (s *Store) AdoptTurns(ctx context.Context, engine, agent string, limit int) ([]string, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	if _, seen := s.seen(); !seen {
		return nil, nil
	}
	return queryStrings(ctx, s.pool, `UPDATE turns t SET follower = $5 FROM (SELECT c.n, c.follower FROM turns c
			WHERE c.status = 'running' AND c.owner_id = $1 AND c.agent = $2 AND c.follower <> $5 AND `+ownerGone("c.follower")+`
			ORDER BY c.n LIMIT $3) gone
		WHERE t.n = gone.n AND t.follower = gone.follower AND t.status = 'running' AND `+judgeIsFresh+`
		RETURNING t.turn_id`, ownerOf(s.owner, engine), agent, limit, freshBeats, s.owner)
}

// Follower implements store.Followers.
func (s *Store) Follower(ctx context.Context, turnID string) (string, error) {
	if s.isClosed() {
		return "", store.ErrClosed
	}
	var f string
	err := s.pool.QueryRow(ctx, `SELECT follower FROM turns WHERE turn_id = $1`, turnID).Scan(&f)
	if isNoRows(err) {
		return "", fmt.Errorf("turn %s: %w", turnID, store.ErrNotFound)
	}
	return f, err
}

var _ store.Followers = (*Store)(nil)

// cancelCalledTx requests the cancel, as client_gone, of the running turns
// whose caller (store.TurnStart.Caller) is owner o, which is gone: turns
// an engine runs for a client whose process went away with it. by says
// who went away.
func cancelCalledTx(ctx context.Context, tx pgx.Tx, o, by string) error {
	ids, err := queryStrings(ctx, tx, `SELECT turn_id FROM turns WHERE caller = $1 AND status = 'running'`, o)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if err := requestCancelTx(ctx, tx, id, budget.ClientGone, by); err != nil {
			return err
		}
	}
	return nil
}

// claim deletes the row of owner o if it is still gone and interrupts its
// running turns, in one transaction; it returns the turns' ids, none when
// another store claimed o first or o came back.
func (s *Store) claim(ctx context.Context, o string, since time.Time) ([]string, error) {
	var ended []store.Ending
	err := s.tx(ctx, func(tx pgx.Tx) error {
		ended = nil
		var (
			host  string
			pid   int
			quiet time.Duration
		)
		err := tx.QueryRow(ctx, `DELETE FROM owners
			WHERE owner_id = $1 AND heartbeat_at < now() - make_interval(secs => $2 * heartbeat_ms / 1000.0)
			AND $3::timestamptz < now() - make_interval(secs => $2 * heartbeat_ms / 1000.0) AND `+judgeIsFresh+`
			RETURNING host, pid, now() - heartbeat_at`, o, Heartbeats, since, freshBeats, s.owner).Scan(&host, &pid, &quiet)
		if isNoRows(err) {
			return nil // claimed by another store, or alive again
		}
		if err != nil {
			return err
		}
		why := fmt.Sprintf("the timebox process running it (pid %d on %s) stopped sending heartbeats %s ago", pid, host, budget.Round(quiet))
		if ended, err = s.interruptOwnerTx(ctx, tx, o, why); err != nil {
			return err
		}
		return cancelCalledTx(ctx, tx, o, fmt.Sprintf("the timebox process following it for its client (pid %d on %s), which stopped sending heartbeats %s ago", pid, host, budget.Round(quiet)))
	})
	if err != nil {
		return nil, err
	}
	ids := s.endedOutside(ended...)
	if len(ids) > 0 {
		s.log.Info("marked turns interrupted: the process running them stopped sending heartbeats", "owner", o, "turns", ids)
	}
	return ids, nil
}

// interruptOwner marks every running turn of owner o interrupted, in one
// transaction.
func (s *Store) interruptOwner(ctx context.Context, o, why string, _ []string) ([]string, error) {
	var ended []store.Ending
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		ended, err = s.interruptOwnerTx(ctx, tx, o, why)
		return err
	})
	if err != nil {
		ended = nil
	}
	return s.endedOutside(ended...), err
}

func (s *Store) interruptOwnerTx(ctx context.Context, tx pgx.Tx, o, why string) ([]store.Ending, error) {
	turns, err := queryStrings(ctx, tx, `SELECT turn_id FROM turns WHERE owner_id = $1 AND status = 'running' ORDER BY n`, o)
	if err != nil {
		return nil, err
	}
	var out []store.Ending
	for _, id := range turns {
		ended, err := s.interruptTurn(ctx, tx, id, store.End{Why: why}, false)
		if err != nil {
			return nil, fmt.Errorf("turn %s: %w", id, err)
		}
		if ended != nil {
			out = append(out, *ended)
		}
	}
	return out, nil
}

// endedOutside tells the followers of the turns, and Options.Ended, that
// the store ended them (committed), and returns their ids.
func (s *Store) endedOutside(ended ...store.Ending) []string {
	var ids []string
	for _, e := range ended {
		s.watch.Wake(e.TurnID)
		if s.ended != nil {
			s.ended(e)
		}
		ids = append(ids, e.TurnID)
	}
	return ids
}

// interruptTurn ends a turn that its process can no longer end
// (store.Interrupt): the records of its running calls, their tool_finished
// and its turn_finished appended to its log, its record, and a
// notification for its followers. The turn is locked first and must still
// be running (and, with orphan, still without an owner row), so that two
// stores never both end it. It returns how it ended the turn, nil when it
// did not.
func (s *Store) interruptTurn(ctx context.Context, tx pgx.Tx, id string, end store.End, orphan bool) (*store.Ending, error) {
	t := store.Interrupted{TurnID: id, End: end}
	var (
		started int64
		status  string
		owner   string
	)
	err := tx.QueryRow(ctx, `SELECT session_id, agent, input, started_at, status, owner_id FROM turns WHERE turn_id = $1 FOR UPDATE`, id).
		Scan(&t.SessionID, &t.Agent, &t.Input, &started, &status, &owner)
	if err != nil {
		return nil, err
	}
	if status != string(budget.StatusRunning) {
		return nil, nil // finished meanwhile
	}
	if orphan {
		var one int
		switch err := tx.QueryRow(ctx, `SELECT 1 FROM owners WHERE owner_id = $1`, owner).Scan(&one); {
		case err == nil:
			return nil, nil // its owner registered meanwhile
		case !isNoRows(err):
			return nil, err
		}
	}
	t.StartedAt = fromNanos(started)
	// An unreadable event does not stop the recovery.
	if t.Events, err = readEvents(ctx, tx, id, 0, nil, true); err != nil {
		return nil, err
	}
	if err := tx.QueryRow(ctx, `SELECT (SELECT COUNT(*) FROM tool_calls WHERE turn_id = $1),
		(SELECT COALESCE(MAX(step), 0) FROM model_calls WHERE turn_id = $1)`, id).Scan(&t.ToolCalls, &t.Steps); err != nil {
		return nil, err
	}
	if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&t.Now); err != nil {
		return nil, err
	}
	out := store.Interrupt(t)
	b := newBatch(tx)
	for _, tc := range out.Calls {
		if err := queueToolCall(ctx, b, tc); err != nil {
			return nil, err
		}
	}
	for _, e := range out.Events {
		c, a := store.StoredEvent(e)
		d, err := event.Marshal(c)
		if err != nil {
			return nil, err
		}
		if err := putTexts(ctx, tx, id, a); err != nil {
			return nil, err
		}
		b.Queue(`INSERT INTO events (turn_id, seq, type, at, data, apart) VALUES ($1, $2, $3, $4, $5, $6)`,
			id, e.Seq, string(e.Type), nanos(e.At), string(d), a.Column())
	}
	rec := out.Record
	rec.TurnID = id
	if err := putRecord(ctx, tx, &b.Batch, &rec); err != nil {
		return nil, err
	}
	b.Queue(`DELETE FROM cancel_requests WHERE turn_id = $1`, id)
	b.Queue(`SELECT pg_notify($1, $2)`, chanEvents, id)
	if err := b.send(ctx); err != nil {
		return nil, err
	}
	ended := t.Ending(out)
	return &ended, nil
}

// InterruptTurn implements store.Interrupter.
func (s *Store) InterruptTurn(ctx context.Context, turnID string, end store.End) (*store.Ending, error) {
	if err := s.Flush(ctx); err != nil {
		return nil, err
	}
	var ended *store.Ending
	err := s.durable(ctx, "the end of turn "+turnID, func(tx pgx.Tx) error {
		var err error
		ended, err = s.interruptTurn(ctx, tx, turnID, end, false)
		if isNoRows(err) {
			return fmt.Errorf("turn %s: %w", turnID, store.ErrNotFound)
		}
		return err
	})
	if err != nil || ended == nil {
		return nil, err
	}
	s.endedOutside(*ended)
	s.cancels.Wake(turnID)
	// The units of the turn running elsewhere stop at once, not at
	// their store's next poll.
	_, _ = s.pool.Exec(ctx, `SELECT pg_notify($1, $2)`, chanCancel, turnID)
	return ended, nil
}

// queryStrings runs a query of one text column and returns its values.
func queryStrings(ctx context.Context, q querier, sql string, args ...any) ([]string, error) {
	rows, err := q.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, pgx.RowTo[string])
}
