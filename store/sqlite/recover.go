package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
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
			WHERE t.status = 'running' AND t.owner_id != ?1
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
	rows, err := s.w.QueryContext(ctx, `SELECT turn_id FROM turns WHERE owner_id = ? AND status = 'running' ORDER BY n`, ownerID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
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
		if err := interruptTurn(ctx, tx, id, why); err != nil {
			tx.Rollback()
			return fmt.Errorf("turn %s: %w", id, err)
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// interruptTurn ends a turn that its process can no longer end: its record
// says interrupted, with a message saying what was running, and its event
// log gets the turn_finished the process never wrote, so that whoever
// follows the log sees it end.
func interruptTurn(ctx context.Context, tx *sql.Tx, id, why string) error {
	var (
		rec     event.Turn
		started int64
		status  string
	)
	err := tx.QueryRowContext(ctx, `SELECT session_id, agent, input, started_at, status FROM turns WHERE turn_id = ?`, id).
		Scan(&rec.SessionID, &rec.Agent, &rec.Input, &started, &status)
	if err != nil {
		return err
	}
	if status != string(budget.StatusRunning) {
		return nil // finished meanwhile
	}
	rec.TurnID, rec.StartedAt = id, fromNanos(started)
	rows, err := tx.QueryContext(ctx, `SELECT data FROM events WHERE turn_id = ? ORDER BY seq`, id)
	if err != nil {
		return err
	}
	var (
		last     int64
		lastAt   = rec.StartedAt
		running  = map[string]*runningCall{} // by call_id
		progress = map[string]int{}          // progress reports by call_id
		model    string                      // a model call under way
		text     strings.Builder             // the reply of the last model call
	)
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			rows.Close()
			return err
		}
		var e event.Event
		if err := json.Unmarshal(b, &e); err != nil {
			continue // an unreadable event does not stop the recovery
		}
		last, lastAt = e.Seq, e.At
		switch d := e.Data.(type) {
		case *event.LLMStarted:
			model = d.Model
			text.Reset()
		case *event.LLMDelta:
			text.WriteString(d.Text)
		case *event.LLMFinished:
			model = ""
		case *event.ToolStarted:
			running[d.CallID] = &runningCall{started: d, at: e.At}
		case *event.ToolProgress:
			progress[d.CallID]++
		case *event.ToolFinished:
			delete(running, d.CallID)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	// The calls that were running get their record, and their log the
	// tool_finished the process never wrote, so that every tool_started
	// has its end: outcome interrupted, ended at the last event stored,
	// which is all that is known (the duration is a lower bound).
	calls := make([]*runningCall, 0, len(running))
	for _, c := range running {
		calls = append(calls, c)
	}
	sort.Slice(calls, func(i, j int) bool { return calls[i].at.Before(calls[j].at) })
	tools := make([]string, 0, len(calls))
	seq := last
	for _, c := range calls {
		tc := c.record(id, lastAt, progress[c.started.CallID], why)
		if err := putToolCall(ctx, tx, tc); err != nil {
			return err
		}
		seq++
		tf := event.Event{Seq: seq, TurnID: id, Type: event.TypeToolFinished, At: time.Now().UTC(), Data: &event.ToolFinished{ToolCall: tc}}
		b, err := json.Marshal(tf)
		if err != nil {
			return err
		}
		if _, err := insertEvent(ctx, tx, id, tf.Seq, tf.Type, tf.At, b); err != nil {
			return err
		}
		tools = append(tools, c.started.Tool)
	}
	var toolCalls int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM tool_calls WHERE turn_id = ?`, id).Scan(&toolCalls); err != nil {
		return err
	}
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(step), 0) FROM model_calls WHERE turn_id = ?`, id).Scan(&rec.Steps); err != nil {
		return err
	}

	rec.Status, rec.StopReason = budget.StatusInterrupted, budget.Interrupted
	rec.EndedAt = lastAt
	rec.WallMS = lastAt.Sub(rec.StartedAt).Milliseconds()
	rec.Answer = text.String()
	if model == "" {
		rec.Answer = ""
	}
	rec.Message = interruptMessage(why, lastAt.Sub(rec.StartedAt), last, tools, model)
	final, err := finalRecord(&rec)
	if err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE turns SET status = ?, stop_reason = ?, message = ?, ended_at = ?, wall_ms = ?,
		steps = ?, record = ? WHERE turn_id = ?`, rec.Status, rec.StopReason, rec.Message, nanos(rec.EndedAt), rec.WallMS,
		rec.Steps, final, id); err != nil {
		return err
	}
	tf := event.Event{Seq: seq + 1, TurnID: id, Type: event.TypeTurnFinished, At: time.Now().UTC(),
		Data: &event.TurnFinished{Status: rec.Status, StopReason: rec.StopReason, Message: rec.Message, Answer: rec.Answer,
			Totals: event.Totals{Steps: rec.Steps, ToolCalls: toolCalls, WallMS: rec.WallMS}}}
	b, err := json.Marshal(tf)
	if err != nil {
		return err
	}
	_, err = insertEvent(ctx, tx, id, tf.Seq, tf.Type, tf.At, b)
	return err
}

// runningCall is a tool call a turn's log shows started and not finished.
type runningCall struct {
	started *event.ToolStarted
	at      time.Time
}

// record returns the record of a call that was running when its process
// stopped: outcome interrupted, ended at the turn's last event.
func (c *runningCall) record(turnID string, lastAt time.Time, progress int, why string) event.ToolCall {
	d := c.started
	end := lastAt
	if end.Before(c.at) {
		end = c.at
	}
	return event.ToolCall{CallID: d.CallID, TurnID: turnID, Step: d.Step, Tool: d.Tool, Kind: d.Kind, Arguments: d.Arguments,
		StartedAt: c.at, EndedAt: end, DurationMS: end.Sub(c.at).Milliseconds(), TimeoutMS: d.TimeoutMS,
		TimeoutSource: d.Source, IdleTimeoutMS: d.IdleTimeoutMS, Enforcement: d.Enforcement,
		Outcome: event.OutcomeInterrupted, ProgressCount: progress,
		Result: fmt.Sprintf("Interrupted: %s while this call was running, at least %s after it started. Its result is unknown.",
			why, budget.Round(end.Sub(c.at)))}
}

// interruptMessage says what happened to an interrupted turn and what was
// running at the time, for the person who asked. How long the turn ran is
// known only up to its last stored event, so it says "at least".
func interruptMessage(why string, ran time.Duration, events int64, tools []string, model string) string {
	var doing string
	switch {
	case len(tools) > 0:
		sort.Strings(tools)
		if len(tools) == 1 {
			doing = fmt.Sprintf(" Tool %s was running; its call is recorded as interrupted.", tools[0])
		} else {
			doing = fmt.Sprintf(" Tools %s were running; their calls are recorded as interrupted.", strings.Join(tools, ", "))
		}
	case model != "":
		doing = fmt.Sprintf(" Model %s was answering.", model)
	}
	return fmt.Sprintf("Interrupted: %s before the turn ended, at least %s after it started (its last stored event; the real end is unknown).%s Everything it emitted until then is kept (%d event%s). Send the message again to retry.",
		why, budget.Round(ran), doing, events, plural(events))
}

func plural(n int64) string {
	if n == 1 {
		return ""
	}
	return "s"
}
