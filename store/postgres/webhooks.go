package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/timebox-run/timebox/store"
)

var _ store.Deliveries = (*Store)(nil)

// EnqueueDeliveries implements store.Deliveries. It is tried again while
// the database is away, as a turn's end is.
func (s *Store) EnqueueDeliveries(ctx context.Context, ds []store.Delivery) error {
	if len(ds) == 0 {
		return nil
	}
	if s.isClosed() {
		return store.ErrClosed
	}
	return s.durable(ctx, "webhook deliveries", func(tx pgx.Tx) error {
		var b pgx.Batch
		for _, d := range ds {
			b.Queue(`INSERT INTO webhook_deliveries (id, url, event_type, turn_id, seq, body, created_at, state, next_attempt_at)
				VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8) ON CONFLICT (id) DO NOTHING`,
				d.ID, text(d.URL), d.EventType, d.TurnID, d.Seq, d.Body, nanos(d.CreatedAt), nanos(d.NextAttemptAt))
		}
		return tx.SendBatch(ctx, &b).Close()
	})
}

// ClaimDeliveries implements store.Deliveries: FOR UPDATE SKIP LOCKED
// lets gateways claiming at once each take other rows, none waiting for
// another's.
func (s *Store) ClaimDeliveries(ctx context.Context, owner string, now time.Time, lease time.Duration, limit int) ([]store.Delivery, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	rows, err := s.pool.Query(ctx, `UPDATE webhook_deliveries SET lease_owner = $1, lease_until = $2
		WHERE n IN (SELECT n FROM webhook_deliveries
			WHERE state = 'pending' AND next_attempt_at <= $3 AND lease_until <= $3
			ORDER BY next_attempt_at, n LIMIT $4 FOR UPDATE SKIP LOCKED)
		RETURNING `+store.DeliveryColumns+`, body`, owner, nanos(now.Add(lease)), nanos(now), limit)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Delivery, error) {
		var body []byte
		d, err := store.ScanDelivery(r, &body)
		d.Body = body
		return d, err
	})
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b store.Delivery) int {
		if c := a.NextAttemptAt.Compare(b.NextAttemptAt); c != 0 {
			return c
		}
		return a.CreatedAt.Compare(b.CreatedAt)
	})
	return out, nil
}

// RecordAttempt implements store.Deliveries.
func (s *Store) RecordAttempt(ctx context.Context, id, owner string, a store.DeliveryAttempt, state store.DeliveryState, next time.Time) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	if state != store.DeliveryPending {
		next = time.Time{}
	}
	return s.durable(ctx, "webhook delivery "+id, func(tx pgx.Tx) error {
		var holder, attempts string
		err := tx.QueryRow(ctx, `SELECT lease_owner, attempts FROM webhook_deliveries WHERE id = $1 FOR UPDATE`, id).Scan(&holder, &attempts)
		switch {
		case isNoRows(err):
			return fmt.Errorf("delivery %s: %w", id, store.ErrNotFound)
		case err != nil:
			return err
		}
		var all []store.DeliveryAttempt
		if err := json.Unmarshal([]byte(attempts), &all); err != nil {
			return fmt.Errorf("delivery %s: its attempts: %w", id, err)
		}
		if holder != owner {
			if store.AttemptRecorded(all, a) {
				return nil // by a try whose answer was lost
			}
			return fmt.Errorf("delivery %s: %w", id, store.ErrLeaseLost)
		}
		b, err := json.Marshal(append(all, a))
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `UPDATE webhook_deliveries SET state = $1, next_attempt_at = $2, lease_owner = '', lease_until = 0, attempts = $3
			WHERE id = $4`, string(state), nanos(next), text(string(b)), id)
		return err
	})
}

// ListDeliveries implements store.Deliveries.
func (s *Store) ListDeliveries(ctx context.Context, f store.DeliveryFilter) ([]store.Delivery, error) {
	return again(ctx, s, func(ctx context.Context) ([]store.Delivery, error) { return s.listDeliveries(ctx, f) })
}

func (s *Store) listDeliveries(ctx context.Context, f store.DeliveryFilter) ([]store.Delivery, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	var where []string
	var args []any
	if f.State != "" {
		args = append(args, string(f.State))
		where = append(where, "state = $"+strconv.Itoa(len(args)))
	}
	if f.TurnID != "" {
		args = append(args, f.TurnID)
		where = append(where, "turn_id = $"+strconv.Itoa(len(args)))
	}
	q := `SELECT ` + store.DeliveryColumns + ` FROM webhook_deliveries`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	args = append(args, store.ClampLimit(f.Limit))
	q += " ORDER BY n DESC LIMIT $" + strconv.Itoa(len(args))
	rows, err := s.pool.Query(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (store.Delivery, error) { return store.ScanDelivery(r, nil) })
	if out == nil && err == nil {
		out = []store.Delivery{}
	}
	return out, err
}

// PruneDeliveries implements store.Deliveries.
func (s *Store) PruneDeliveries(ctx context.Context, before time.Time) (int, error) {
	if s.isClosed() {
		return 0, store.ErrClosed
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM webhook_deliveries WHERE state <> 'pending' AND created_at < $1`, nanos(before))
	if err != nil {
		return 0, err
	}
	return int(tag.RowsAffected()), nil
}
