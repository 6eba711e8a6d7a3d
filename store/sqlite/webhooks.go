package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/timebox-run/timebox/store"
)

var _ store.Deliveries = (*Store)(nil)

// EnqueueDeliveries implements store.Deliveries. It is tried again while
// another process holds the file's lock, as a turn's end is.
func (s *Store) EnqueueDeliveries(ctx context.Context, ds []store.Delivery) error {
	if len(ds) == 0 {
		return nil
	}
	return s.durable(ctx, "webhook deliveries", func(tx *wtx) error {
		for _, d := range ds {
			if _, err := tx.ExecContext(ctx, `INSERT INTO webhook_deliveries
				(id, url, event_type, turn_id, seq, body, created_at, state, next_attempt_at)
				VALUES (?, ?, ?, ?, ?, ?, ?, 'pending', ?) ON CONFLICT (id) DO NOTHING`,
				d.ID, d.URL, d.EventType, d.TurnID, d.Seq, d.Body, nanos(d.CreatedAt), nanos(d.NextAttemptAt)); err != nil {
				return err
			}
		}
		return nil
	})
}

// ClaimDeliveries implements store.Deliveries. One writer holds the file
// at a time, so the UPDATE that takes the leases is atomic among every
// process sharing it.
func (s *Store) ClaimDeliveries(ctx context.Context, owner string, now time.Time, lease time.Duration, limit int) ([]store.Delivery, error) {
	var out []store.Delivery
	err := s.tx(ctx, func(tx *wtx) error {
		out = out[:0]
		rows, err := tx.QueryContext(ctx, `UPDATE webhook_deliveries SET lease_owner = ?, lease_until = ?
			WHERE n IN (SELECT n FROM webhook_deliveries
				WHERE state = 'pending' AND next_attempt_at <= ? AND lease_until <= ?
				ORDER BY next_attempt_at, n LIMIT ?)
			RETURNING `+store.DeliveryColumns+`, body`, owner, nanos(now.Add(lease)), nanos(now), nanos(now), limit)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var body []byte
			d, err := store.ScanDelivery(rows, &body)
			if err != nil {
				return err
			}
			d.Body = body
			out = append(out, d)
		}
		return rows.Err()
	})
	if err != nil {
		return nil, err
	}
	// RETURNING gives no order.
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
	att, err := json.Marshal(a)
	if err != nil {
		return err
	}
	if state != store.DeliveryPending {
		next = time.Time{}
	}
	return s.durable(ctx, "webhook delivery "+id, func(tx *wtx) error {
		var holder string
		err := tx.QueryRowContext(ctx, `SELECT lease_owner FROM webhook_deliveries WHERE id = ?`, id).Scan(&holder)
		switch {
		case err == sql.ErrNoRows:
			return fmt.Errorf("delivery %s: %w", id, store.ErrNotFound)
		case err != nil:
			return err
		case holder != owner:
			return fmt.Errorf("delivery %s: %w", id, store.ErrLeaseLost)
		}
		_, err = tx.ExecContext(ctx, `UPDATE webhook_deliveries SET state = ?, next_attempt_at = ?, lease_owner = '', lease_until = 0,
			attempts = json_insert(attempts, '$[#]', json(?)) WHERE id = ?`, string(state), nanos(next), string(att), id)
		return err
	})
}

// ListDeliveries implements store.Deliveries.
func (s *Store) ListDeliveries(ctx context.Context, f store.DeliveryFilter) ([]store.Delivery, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	var where []string
	var args []any
	if f.State != "" {
		where, args = append(where, "state = ?"), append(args, string(f.State))
	}
	if f.TurnID != "" {
		where, args = append(where, "turn_id = ?"), append(args, f.TurnID)
	}
	q := `SELECT ` + store.DeliveryColumns + ` FROM webhook_deliveries`
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY n DESC LIMIT ?"
	rows, err := s.r.QueryContext(ctx, q, append(args, store.ClampLimit(f.Limit))...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.Delivery{}
	for rows.Next() {
		d, err := store.ScanDelivery(rows, nil)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// PruneDeliveries implements store.Deliveries.
func (s *Store) PruneDeliveries(ctx context.Context, before time.Time) (int, error) {
	var n int64
	err := s.tx(ctx, func(tx *wtx) error {
		res, err := tx.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE state <> 'pending' AND created_at < ?`, nanos(before))
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return int(n), err
}
