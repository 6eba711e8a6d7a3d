package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

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

// Payload implements store.Payloads.
func (s *Store) Payload(ctx context.Context, turnID, key string) ([]byte, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	var data []byte
	err := s.pool.QueryRow(ctx, `SELECT data FROM payloads WHERE turn_id = $1 AND key = $2`, turnID, key).Scan(&data)
	if isNoRows(err) {
		return nil, fmt.Errorf("payload %s of turn %s: %w", key, turnID, store.ErrNotFound)
	}
	return data, err
}

// PayloadRange implements store.Payloads.
func (s *Store) PayloadRange(ctx context.Context, turnID, prefix string) ([]store.Payload, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	rows, err := s.pool.Query(ctx, `SELECT key, data FROM payloads WHERE turn_id = $1 AND starts_with(key, $2) ORDER BY key COLLATE "C"`,
		turnID, prefix)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Payload, error) {
		var p store.Payload
		err := r.Scan(&p.Key, &p.Data)
		return p, err
	})
}
