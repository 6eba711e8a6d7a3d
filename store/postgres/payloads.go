package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/timebox-run/timebox/store"
)

var _ store.Payloads = (*Store)(nil)

// PutPayloads implements store.Payloads.
func (s *Store) PutPayloads(ctx context.Context, turnID string, p map[string][]byte) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	var b pgx.Batch
	for k, v := range p {
		b.Queue(`INSERT INTO payloads (turn_id, key, data) VALUES ($1, $2, $3)
			ON CONFLICT (turn_id, key) DO UPDATE SET data = excluded.data`, turnID, k, v)
	}
	return s.durable(ctx, "the conversation of turn "+turnID, func(tx pgx.Tx) error { return tx.SendBatch(ctx, &b).Close() })
}

// Payload implements store.Payloads: the value is lent from the
// connection's read buffer, as in PayloadRange.
func (s *Store) Payload(ctx context.Context, turnID, key string, use func(data []byte) error) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	found := false
	err := s.payloads(ctx, `SELECT key, data FROM payloads WHERE turn_id = $1 AND key = $2`, []any{turnID, key},
		func(_ string, data []byte) error {
			found = true
			return use(data)
		})
	if err == nil && !found {
		return fmt.Errorf("payload %s of turn %s: %w", key, turnID, store.ErrNotFound)
	}
	return err
}

// PayloadRange implements store.Payloads: each value is lent from the
// connection's read buffer (pgtype.DriverBytes), not copied.
func (s *Store) PayloadRange(ctx context.Context, turnID, prefix string, each func(key string, data []byte) error) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	return s.payloads(ctx, `SELECT key, data FROM payloads WHERE turn_id = $1 AND starts_with(key, $2) ORDER BY key COLLATE "C"`,
		[]any{turnID, prefix}, each)
}

// payloads calls each with the key and data of every row of query, the
// data lent from the connection's buffer.
func (s *Store) payloads(ctx context.Context, query string, args []any, each func(key string, data []byte) error) error {
	rows, err := s.pool.Query(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var key string
		var data pgtype.DriverBytes
		if err := rows.Scan(&key, &data); err != nil {
			return err
		}
		if err := each(key, data); err != nil {
			return err
		}
	}
	return rows.Err()
}
