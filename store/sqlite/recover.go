package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/store"
)

// owner is a row of the owners table; a turn whose owner_id has no row has
// a zero owner (gone).
type owner struct {
	id        string
	pid       int
	pidStart  string
	machine   string
	heartbeat time.Time
	exists    bool
}

// gone reports whether o can no longer finish its turns, and says why in
// words for the turn's message.
func (s *Store) gone(o owner, now time.Time) (bool, string) {
	if !o.exists {
		return true, "the timebox process running it stopped"
	}
	pidGone := fmt.Sprintf("the timebox process running it (pid %d) stopped", o.pid)
	if o.machine == s.machine {
		if o.pid == os.Getpid() {
			// Another store of this very process: alive while it is open.
			_, open := liveOwners.Load(o.id)
			return !open, "the store running it was closed without finishing it"
		}
		if alive, known := processAlive(o.pid, o.pidStart); known {
			return !alive, pidGone
		}
	}
	if now.Sub(o.heartbeat) > s.stale {
		return true, fmt.Sprintf("the timebox process running it (pid %d) stopped sending heartbeats %s ago",
			o.pid, budget.Round(now.Sub(o.heartbeat)))
	}
	return false, ""
}

// recover marks interrupted the running turns of every owner that is gone,
// removes those owners, and returns the turns' ids.
func (s *Store) recover(ctx context.Context) ([]string, error) {
	rows, err := s.w.QueryContext(ctx, `
		SELECT o.owner_id, o.pid, o.pid_start, o.machine, o.heartbeat_at, 1 FROM owners o WHERE o.owner_id != ?1
		UNION
		SELECT DISTINCT t.owner_id, 0, '', '', 0, 0 FROM turns t
			WHERE t.status = 'running' AND t.owner_id != ?1 AND t.owner_id != 'suspended'
			AND NOT EXISTS (SELECT 1 FROM owners o WHERE o.owner_id = t.owner_id)`, s.owner)
	if err != nil {
		return nil, err
	}
	var owners []owner
	for rows.Next() {
		var o owner
		var hb int64
		if err := rows.Scan(&o.id, &o.pid, &o.pidStart, &o.machine, &hb, &o.exists); err != nil {
			rows.Close()
			return nil, err
		}
		o.heartbeat = fromNanos(hb)
		owners = append(owners, o)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	now := time.Now()
	var ids []string
	for _, o := range owners {
		dead, why := s.gone(o, now)
		if !dead {
			continue
		}
		got, err := s.turnsOf(ctx, o.id)
		if err != nil {
			return ids, err
		}
		if err := s.interruptOwner(ctx, o.id, why); err != nil {
			return ids, err
		}
		if _, err := s.w.ExecContext(ctx, `DELETE FROM owners WHERE owner_id = ?`, o.id); err != nil {
			return ids, err
		}
		ids = append(ids, got...)
	}
	return ids, nil
}

func (s *Store) turnsOf(ctx context.Context, ownerID string) ([]string, error) {
	return queryStrings(ctx, s.w, `SELECT turn_id FROM turns WHERE owner_id = ? AND status = 'running' ORDER BY n`, ownerID)
}

// queryStrings returns the first column of query's rows.
func queryStrings(ctx context.Context, db *sql.DB, query string, args ...any) ([]string, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var v string
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// interruptOwner marks every running turn of ownerID interrupted, each in
// its own transaction.
func (s *Store) interruptOwner(ctx context.Context, ownerID, why string) error {
	ids, err := s.turnsOf(ctx, ownerID)
	if err != nil {
		return err
	}
	for _, id := range ids {
		tx, err := s.w.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		ended, err := interruptTurn(ctx, &wtx{Tx: tx, prepared: s.prepared}, id, why)
		if err != nil {
			tx.Rollback()
			return fmt.Errorf("turn %s: %w", id, err)
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		s.watch.Wake(id)
		if ended != nil && s.ended != nil {
			s.ended(*ended)
		}
	}
	return nil
}

// interruptTurn ends a turn that its process can no longer end: its record
// says interrupted, with a message saying what was running, and its event
// log gets the turn_finished the process never wrote, so that whoever
// follows the log sees it end (store.Interrupt). It returns how, nil when
// the turn had finished meanwhile.
func interruptTurn(ctx context.Context, tx *wtx, id, why string) (*store.Ending, error) {
	t := store.Interrupted{TurnID: id, End: store.End{Why: why}, Now: time.Now()}
	var (
		started int64
		status  string
	)
	err := tx.QueryRowContext(ctx, `SELECT session_id, agent, input, started_at, status FROM turns WHERE turn_id = ?`, id).
		Scan(&t.SessionID, &t.Agent, &t.Input, &started, &status)
	if err != nil {
		return nil, err
	}
	if status != string(budget.StatusRunning) {
		return nil, nil // finished meanwhile
	}
	t.StartedAt = fromNanos(started)
	t.Events, err = readEvents(ctx, tx, "apart", id, 0, -1, true)
	if err != nil {
		return nil, err
	}
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM tool_calls WHERE turn_id = ?`, id).Scan(&t.ToolCalls); err != nil {
		return nil, err
	}
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(step), 0) FROM model_calls WHERE turn_id = ?`, id).Scan(&t.Steps); err != nil {
		return nil, err
	}
	out := store.Interrupt(t)
	for _, tc := range out.Calls {
		if err := putToolCall(ctx, tx, tc); err != nil {
			return nil, err
		}
	}
	for _, e := range out.Events {
		e.TurnID = id
		if _, err := insertEvent(ctx, tx, e); err != nil {
			return nil, err
		}
	}
	rec := out.Record
	rec.TurnID = id
	if err := putRecord(ctx, tx, &rec); err != nil {
		return nil, err
	}
	ended := t.Ending(out)
	return &ended, nil
}
