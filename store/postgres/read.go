package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/store"
)

// Turn implements store.Store.
func (s *Store) Turn(ctx context.Context, id string) (*event.Turn, error) {
	return again(ctx, s, func(ctx context.Context) (*event.Turn, error) { return s.turn(ctx, id, true) })
}

// TurnWithoutResults implements store.Payloads: the tool call records are
// decoded with their results skipped, never copied out of the
// connection's buffer.
func (s *Store) TurnWithoutResults(ctx context.Context, id string) (*event.Turn, error) {
	return again(ctx, s, func(ctx context.Context) (*event.Turn, error) { return s.turn(ctx, id, false) })
}

// turn reads turn id's record, its tool calls' results too when results.
func (s *Store) turn(ctx context.Context, id string, results bool) (*event.Turn, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	var out *event.Turn
	// One snapshot for the turn and its calls.
	err := pgx.BeginTxFunc(ctx, s.pool, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		var (
			rec     event.Turn
			started int64
			ended   *int64
			final   *string
			kept    string
		)
		err := tx.QueryRow(ctx, `SELECT turn_id, session_id, agent, input, status, stop_reason, message, started_at,
			ended_at, wall_ms, steps, record, apart FROM turns WHERE turn_id = $1`, id).Scan(&rec.TurnID, &rec.SessionID, &rec.Agent,
			&rec.Input, &rec.Status, &rec.StopReason, &rec.Message, &started, &ended, &rec.WallMS, &rec.Steps, &final, &kept)
		if isNoRows(err) {
			return fmt.Errorf("turn %s: %w", id, store.ErrNotFound)
		}
		if err != nil {
			return err
		}
		if final != nil {
			rec = event.Turn{}
			if err := json.Unmarshal([]byte(*final), &rec); err != nil {
				return fmt.Errorf("turn %s: reading its record: %w", id, err)
			}
			if a := store.ParseApart(kept); len(a) > 0 {
				texts, err := readTexts(ctx, tx, id, a)
				if err != nil {
					return fmt.Errorf("turn %s: reading its record's texts: %w", id, err)
				}
				store.FillRecord(&rec, a, texts)
			}
		} else {
			rec.StartedAt = fromNanos(started)
			if ended != nil {
				rec.EndedAt = fromNanos(*ended)
			}
		}
		if results {
			rec.ToolCalls, err = scanJSON[event.ToolCall](ctx, tx, toolCallsSQL, id)
		} else {
			rec.ToolCalls, err = scanWithoutResults(ctx, tx, id)
		}
		if err != nil {
			return err
		}
		if rec.ModelCalls, err = scanJSON[event.ModelCall](ctx, tx, modelCallsSQL, id); err != nil {
			return err
		}
		if rec.Status == budget.StatusRunning {
			for _, mc := range rec.ModelCalls {
				rec.Steps = max(rec.Steps, mc.Step)
			}
		}
		out = &rec
		return nil
	})
	return out, err
}

func scanJSON[T any](ctx context.Context, q interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, query string, args ...any) ([]T, error) {
	rows, err := q.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []T{}
	for rows.Next() {
		// Decoded from the connection's buffer: a record holding a result
		// of megabytes is not copied twice first.
		var b pgtype.DriverBytes
		if err := rows.Scan(&b); err != nil {
			return nil, err
		}
		var v T
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// scanWithoutResults reads turn id's tool call records, in Turn's order,
// without their results.
func scanWithoutResults(ctx context.Context, tx pgx.Tx, id string) ([]event.ToolCall, error) {
	calls, err := scanJSON[noResult](ctx, tx, toolCallsSQL, id)
	if err != nil {
		return nil, err
	}
	tools := make([]event.ToolCall, len(calls))
	for i, c := range calls {
		tools[i] = c.ToolCall
	}
	return tools, nil
}

// noResult decodes a tool call's record without its result.
type noResult struct {
	event.ToolCall
	Result skipped `json:"result"`
}

// skipped is a JSON value decoded as nothing: the decoder checks it and
// hands it over in place, and it is not kept.
type skipped struct{}

// UnmarshalJSON accepts any value and keeps nothing.
func (*skipped) UnmarshalJSON([]byte) error { return nil }

// The call records of a turn, in Turn's order.
const (
	toolCallsSQL  = `SELECT record FROM tool_calls WHERE turn_id = $1 ORDER BY started_at, call_id`
	modelCallsSQL = `SELECT record FROM model_calls WHERE turn_id = $1 ORDER BY idx`
)

// summaryColumns select a store.TurnSummary from turns t (scanSummary).
const summaryColumns = `t.turn_id, t.session_id, t.agent, substr(t.input, 1, 300), t.status, t.stop_reason, t.message,
	t.started_at, t.ended_at, t.wall_ms, t.steps,
	(SELECT COUNT(*) FROM tool_calls c WHERE c.turn_id = t.turn_id),
	(SELECT COALESCE(MAX(seq), 0) FROM events e WHERE e.turn_id = t.turn_id),
	(SELECT COALESCE(MAX(step), 0) FROM model_calls m WHERE m.turn_id = t.turn_id), t.apart`

func (s *Store) summaries(ctx context.Context, query string, args ...any) ([]store.TurnSummary, error) {
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return store.ReadRows(rows, rows.Close, func() (store.TurnSummary, string, store.Apart, bool, error) {
		var (
			ts       store.TurnSummary
			started  int64
			ended    *int64
			runSteps int
			apart    string
		)
		if err := rows.Scan(&ts.TurnID, &ts.SessionID, &ts.Agent, &ts.Input, &ts.Status, &ts.StopReason, &ts.Message,
			&started, &ended, &ts.WallMS, &ts.Steps, &ts.ToolCalls, &ts.Events, &runSteps, &apart); err != nil {
			return ts, "", nil, false, err
		}
		ts.Input = store.ShortInput(ts.Input)
		ts.StartedAt = fromNanos(started)
		if ended != nil {
			t := fromNanos(*ended)
			ts.EndedAt = &t
		}
		if ts.Status == budget.StatusRunning {
			ts.Steps = runSteps
		}
		return ts, ts.TurnID, store.ParseApart(apart), true, nil
	}, func(id string, a store.Apart) (map[string]string, error) {
		return readTexts(ctx, s.pool, id, a)
	}, func(ts *store.TurnSummary, a store.Apart, texts map[string]string) {
		store.FillMessage(&ts.Message, a, texts)
	})
}

// Turns implements store.Store.
func (s *Store) Turns(ctx context.Context, f store.Filter) ([]store.TurnSummary, error) {
	return again(ctx, s, func(ctx context.Context) ([]store.TurnSummary, error) { return s.turnsOnce(ctx, f) })
}

func (s *Store) turnsOnce(ctx context.Context, f store.Filter) ([]store.TurnSummary, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	var where []string
	var args []any
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if f.Status != "" {
		where = append(where, "t.status = "+arg(string(f.Status)))
	}
	if f.StopReason != "" {
		where = append(where, "t.stop_reason = "+arg(string(f.StopReason)))
	}
	if f.SessionID != "" {
		where = append(where, "t.session_id = "+arg(f.SessionID))
	}
	if f.Before != "" {
		var n int64
		err := s.pool.QueryRow(ctx, `SELECT n FROM turns WHERE turn_id = $1`, f.Before).Scan(&n)
		if isNoRows(err) {
			return nil, fmt.Errorf("turn %s: %w", f.Before, store.ErrNotFound)
		}
		if err != nil {
			return nil, err
		}
		where = append(where, "t.n < "+arg(n))
	}
	q := "SELECT " + summaryColumns + " FROM turns t"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY t.n DESC LIMIT " + arg(store.ClampLimit(f.Limit))
	return s.summaries(ctx, q, args...)
}

// Events implements store.Store.
func (s *Store) Events(ctx context.Context, turnID string, after int64, limit int) ([]event.Event, error) {
	return again(ctx, s, func(ctx context.Context) ([]event.Event, error) { return s.eventsOnce(ctx, turnID, after, limit) })
}

func (s *Store) eventsOnce(ctx context.Context, turnID string, after int64, limit int) ([]event.Event, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	var lim *int
	if limit > 0 {
		lim = &limit // NULL: no limit
	}
	out, err := readEvents(ctx, s.pool, turnID, after, lim, false)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		var one int
		err := s.pool.QueryRow(ctx, `SELECT 1 FROM turns WHERE turn_id = $1`, turnID).Scan(&one)
		if isNoRows(err) {
			return nil, fmt.Errorf("turn %s: %w", turnID, store.ErrNotFound)
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Session implements store.Store.
func (s *Store) Session(ctx context.Context, id string) (*store.Session, error) {
	return again(ctx, s, func(ctx context.Context) (*store.Session, error) { return s.sessionOnce(ctx, id) })
}

func (s *Store) sessionOnce(ctx context.Context, id string) (*store.Session, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	var created, updated int64
	err := s.pool.QueryRow(ctx, `SELECT created_at, updated_at FROM sessions WHERE session_id = $1`, id).Scan(&created, &updated)
	if isNoRows(err) {
		return nil, fmt.Errorf("session %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	out := &store.Session{SessionID: id, CreatedAt: fromNanos(created), UpdatedAt: fromNanos(updated)}
	out.Turns, err = s.summaries(ctx, "SELECT "+summaryColumns+" FROM turns t WHERE t.session_id = $1 ORDER BY t.n", id)
	if err != nil {
		return nil, err
	}
	out.Messages, err = s.messages(ctx, id)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// Sessions implements store.Store.
func (s *Store) Sessions(ctx context.Context, limit int) ([]store.SessionSummary, error) {
	return again(ctx, s, func(ctx context.Context) ([]store.SessionSummary, error) { return s.sessionsOnce(ctx, limit) })
}

func (s *Store) sessionsOnce(ctx context.Context, limit int) ([]store.SessionSummary, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	rows, err := s.pool.Query(ctx, `SELECT s.session_id, s.created_at, s.updated_at,
		(SELECT COUNT(*) FROM turns t WHERE t.session_id = s.session_id),
		COALESCE((SELECT substr(t.input, 1, 300) FROM turns t WHERE t.session_id = s.session_id ORDER BY t.n LIMIT 1), '')
		FROM sessions s ORDER BY s.updated_at DESC, s.n DESC LIMIT $1`, store.ClampLimit(limit))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.SessionSummary{}
	for rows.Next() {
		var ss store.SessionSummary
		var created, updated int64
		if err := rows.Scan(&ss.SessionID, &created, &updated, &ss.Turns, &ss.Title); err != nil {
			return nil, err
		}
		ss.CreatedAt, ss.UpdatedAt, ss.Title = fromNanos(created), fromNanos(updated), store.ShortInput(ss.Title)
		out = append(out, ss)
	}
	return out, rows.Err()
}

// History implements store.Store.
func (s *Store) History(ctx context.Context, sessionID string) ([]model.Message, error) {
	return again(ctx, s, func(ctx context.Context) ([]model.Message, error) { return s.historyOnce(ctx, sessionID) })
}

func (s *Store) historyOnce(ctx context.Context, sessionID string) ([]model.Message, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	msgs, err := s.messages(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	var out []model.Message
	for _, m := range msgs {
		out = append(out, m.Message)
	}
	return out, nil
}
