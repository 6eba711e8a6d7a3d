package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/internal/retry"
)

// A turn's long texts — an answer of megabytes — are stored once, in
// pieces of bytes (bytea keeps a NUL a text column would refuse), in the
// texts table (store.Apart, docs/decisions/long-texts.md): the
// turn_finished event, the turn's record and message and the session's
// messages name them in their apart column. Before, the end of a turn with
// a 15 MB answer marshalled every event of its log again and sent the
// answer six times over; the driver built each statement's values whole.

// putTexts stores in tx the pieces of the texts of a that the turn does
// not have yet: as a rule none, for prestore stored them before the
// transaction; and a text the turn already has under its name (the
// answer, stored with turn_finished before the record) is not written
// again. A piece is one statement, so that the driver holds one piece at a
// time.
func putTexts(ctx context.Context, tx pgx.Tx, turnID string, a store.Apart) error {
	_, err := writeTexts(ctx, tx, turnID, a)
	return err
}

// prestore stores the pieces of the texts of a that turnID does not have
// yet, each committed on its own, before the transaction that names them
// — the group with its turn_finished, the turn's end — and that then finds
// them stored. That transaction is short, and a text of megabytes goes on
// from the pieces it stored when its connection is cut: in one
// transaction, a 15 MB answer whose connections were cut every 250 ms was
// stored only when a whole try passed between two cuts, after backoffs
// doubled to seconds (16.5 s after turn_finished, once). A failure after
// some pieces were stored is retry.Progressed: the next try comes after the
// first backoff. Nothing is stored for a turn that is not running (or not
// begun): its transaction refuses it, or begins it and stores its texts
// there.
func (s *Store) prestore(ctx context.Context, turnID string, a store.Apart) error {
	if len(a) == 0 {
		return nil
	}
	var status string
	err := s.pool.QueryRow(ctx, `SELECT status FROM turns WHERE turn_id = $1`, turnID).Scan(&status)
	if isNoRows(err) || err == nil && status != string(budget.StatusRunning) {
		return nil
	}
	if err != nil {
		return err
	}
	wrote, err := writeTexts(ctx, s.pool, turnID, a)
	if err != nil && wrote > 0 {
		return retry.Progressed(err)
	}
	return err
}

// beforePiece, in tests, is called before each piece is written; its
// error stands for the write's.
var beforePiece func() error

// execer is a pool or a transaction.
type execer interface {
	querier
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// writeTexts writes through q the pieces of a's texts that turnID does not
// have, and returns how many it wrote. Pieces are cut the same way each
// time (store.TextPieces), so one stored by an earlier try is the same.
func writeTexts(ctx context.Context, q execer, turnID string, a store.Apart) (int, error) {
	wrote := 0
	for _, t := range a.Texts() {
		have, err := storedPieces(ctx, q, turnID, t.Name)
		if err != nil {
			return wrote, err
		}
		err = store.TextPieces(t.Text, func(i int, piece string) error {
			if have[i] {
				return nil
			}
			if beforePiece != nil {
				if err := beforePiece(); err != nil {
					return err
				}
			}
			_, err := q.Exec(ctx, `INSERT INTO texts (turn_id, name, i, piece) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING`,
				turnID, t.Name, i, []byte(piece))
			if err == nil {
				wrote++
			}
			return err
		})
		if err != nil {
			return wrote, err
		}
	}
	return wrote, nil
}

// storedPieces returns the indexes of the pieces of turnID's text name
// that are stored.
func storedPieces(ctx context.Context, q querier, turnID, name string) (map[int]bool, error) {
	rows, err := q.Query(ctx, `SELECT i FROM texts WHERE turn_id = $1 AND name = $2`, turnID, name)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	have := map[int]bool{}
	for rows.Next() {
		var i int
		if err := rows.Scan(&i); err != nil {
			return nil, err
		}
		have[i] = true
	}
	return have, rows.Err()
}

// readTexts reads the stored texts of turnID that a names, by name.
func readTexts(ctx context.Context, q querier, turnID string, a store.Apart) (map[string]string, error) {
	names := a.Names()
	if len(names) == 0 {
		return nil, nil
	}
	rows, err := q.Query(ctx, `SELECT name, piece FROM texts WHERE turn_id = $1 AND name = ANY($2::text[]) ORDER BY name, i`, turnID, names)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return store.ReadTexts(rows)
}

// readEvents reads turnID's events after seq after, at most lim (nil: all),
// their long texts in place. An event that cannot be read is an error, or
// skipped when skipBad.
func readEvents(ctx context.Context, q querier, turnID string, after int64, lim *int, skipBad bool) ([]event.Event, error) {
	rows, err := q.Query(ctx, `SELECT data, apart FROM events WHERE turn_id = $1 AND seq > $2 ORDER BY seq LIMIT $3`, turnID, after, lim)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return store.ReadEvents(rows, rows.Close, turnID, skipBad, func(id string, a store.Apart) (map[string]string, error) {
		return readTexts(ctx, q, id, a)
	})
}

// messages reads a session's conversation, its long contents in place.
func (s *Store) messages(ctx context.Context, sessionID string) ([]store.Message, error) {
	rows, err := s.pool.Query(ctx, `SELECT turn_id, message, apart FROM messages WHERE session_id = $1 ORDER BY id`, sessionID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return store.ReadMessages(rows, rows.Close, func(id string, a store.Apart) (map[string]string, error) {
		return readTexts(ctx, s.pool, id, a)
	})
}

// putRecord queues into b the update that stores a turn's end — its
// status, message and record — after storing its long texts.
func putRecord(ctx context.Context, tx pgx.Tx, b *pgx.Batch, rec *event.Turn) error {
	stored, a := store.RecordApart(rec)
	final, err := store.FinalRecord(stored)
	if err != nil {
		return err
	}
	if err := putTexts(ctx, tx, rec.TurnID, a); err != nil {
		return err
	}
	b.Queue(`UPDATE turns SET status = $1, stop_reason = $2, message = $3, ended_at = $4,
		wall_ms = $5, steps = $6, record = $7, apart = $8 WHERE turn_id = $9`,
		string(rec.Status), string(rec.StopReason), text(stored.Message), nanos(rec.EndedAt), rec.WallMS, rec.Steps,
		string(final), a.Column(), rec.TurnID)
	return nil
}
