package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/timebox-run/timebox/store"
)

// A turn's long texts — an answer of megabytes — are stored once, in
// pieces, in the texts table (store.Apart, docs/decisions/long-texts.md):
// the turn_finished event, the turn's record and message and the session's
// messages name them in their apart column. Before, the end of a turn
// with a 15 MB answer bound it five times over to SQLite's statements, and
// SQLite copied each into its own heap whole; a piece at a time, that heap
// holds one piece.

// putTexts stores the texts of a once each: a text a turn already has
// under its name (the answer, stored with turn_finished before the
// record) is not written again.
func putTexts(ctx context.Context, tx *wtx, turnID string, a store.Apart) error {
	for _, t := range a.Texts() {
		var one int
		err := tx.QueryRowContext(ctx, `SELECT 1 FROM texts WHERE turn_id = ? AND name = ? AND i = 0`, turnID, t.Name).Scan(&one)
		if err == nil {
			continue
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		err = store.TextPieces(t.Text, func(i int, piece string) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO texts (turn_id, name, i, piece) VALUES (?, ?, ?, ?)`, turnID, t.Name, i, piece)
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// querier is a *sql.DB or a *sql.Tx.
type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// readTexts reads the stored texts of turnID that a names, by name.
func readTexts(ctx context.Context, q querier, turnID string, a store.Apart) (map[string]string, error) {
	names := a.Names()
	if len(names) == 0 {
		return nil, nil
	}
	args := []any{turnID}
	for _, n := range names {
		args = append(args, n)
	}
	rows, err := q.QueryContext(ctx, `SELECT name, piece FROM texts WHERE turn_id = ? AND name IN (?`+
		strings.Repeat(", ?", len(names)-1)+`) ORDER BY name, i`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return store.ReadTexts(rows)
}
