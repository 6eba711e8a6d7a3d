package postgres

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
)

// A turn's long texts — an answer of megabytes — are stored once, in
// pieces of bytes (bytea keeps a NUL a text column would refuse), in the
// texts table (store.Apart, docs/decisions/long-texts.md): the
// turn_finished event, the turn's record and message and the session's
// messages name them in their apart column. Before, the end of a turn with
// a 15 MB answer marshalled every event of its log again and sent the
// answer six times over; the driver built each statement's values whole.

// putTexts stores the texts of a once each: a text a turn already has
// under its name (the answer, stored with turn_finished before the
// record) is not written again. A piece is one statement, so that the
// driver holds one piece at a time.
func putTexts(ctx context.Context, tx pgx.Tx, turnID string, a store.Apart) error {
	for _, t := range a.Texts() {
		var one int
		err := tx.QueryRow(ctx, `SELECT 1 FROM texts WHERE turn_id = $1 AND name = $2 AND i = 0`, turnID, t.Name).Scan(&one)
		if err == nil {
			continue
		}
		if !isNoRows(err) {
			return err
		}
		err = store.TextPieces(t.Text, func(i int, piece string) error {
			_, err := tx.Exec(ctx, `INSERT INTO texts (turn_id, name, i, piece) VALUES ($1, $2, $3, $4)`, turnID, t.Name, i, []byte(piece))
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
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
