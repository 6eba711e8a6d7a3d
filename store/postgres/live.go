package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/store"
)

// Watch implements store.Store: a commit of this store wakes the turn's
// watchers at once, one of another store when its notification arrives,
// and every Options.Poll all watchers are woken anyway, should a
// notification have been lost.
func (s *Store) Watch(turnID string) (<-chan struct{}, func()) { return s.watch.Add(turnID) }

// WatchCancel implements store.Store.
func (s *Store) WatchCancel(turnID string) (<-chan struct{}, func()) {
	ch, stop := s.cancels.Add(turnID)
	return ch, stop
}

// RequestCancel implements store.Store: the request is a row in
// cancel_requests and a notification; the store running the turn cancels
// it on the notification, or at its next poll when the notification was
// lost. A turn whose store is gone is not cancelled: it is marked
// interrupted once its owner's heartbeat window has passed.
func (s *Store) RequestCancel(ctx context.Context, turnID string) error {
	// Again on a connection found dead: the request is kept once however
	// often it is stored.
	_, err := again(ctx, s, func(ctx context.Context) (struct{}, error) { return struct{}{}, s.requestCancel(ctx, turnID) })
	return err
}

func (s *Store) requestCancel(ctx context.Context, turnID string) error {
	return s.tx(ctx, func(tx pgx.Tx) error {
		var status string
		err := tx.QueryRow(ctx, `SELECT status FROM turns WHERE turn_id = $1 FOR SHARE`, turnID).Scan(&status)
		switch {
		case isNoRows(err):
			return fmt.Errorf("turn %s: %w", turnID, store.ErrNotFound)
		case err != nil:
			return err
		case status != string(budget.StatusRunning):
			return fmt.Errorf("turn %s: %w", turnID, store.ErrNotRunning)
		}
		return requestCancelTx(ctx, tx, turnID, budget.Cancelled, "")
	})
}

// requestCancelTx stores a cancel request for a turn, saying why, and
// notifies the stores sharing the database. A request already pending is
// kept.
func requestCancelTx(ctx context.Context, tx pgx.Tx, turnID string, reason budget.StopReason, by string) error {
	if _, err := tx.Exec(ctx, `INSERT INTO cancel_requests (turn_id, reason, requested_by) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`,
		turnID, string(reason), by); err != nil {
		return err
	}
	_, err := tx.Exec(ctx, `SELECT pg_notify($1, $2)`, chanCancel, turnID)
	return err
}

// anyCancel is the key of the watchers of every cancel request
// (WatchCancels) in the set of the turns' own.
const anyCancel = "*"

// WatchCancels implements store.EngineCancels.
func (s *Store) WatchCancels() (<-chan struct{}, func()) { return s.cancels.Add(anyCancel) }

// EngineCancels implements store.EngineCancels.
func (s *Store) EngineCancels(ctx context.Context) ([]string, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	return again(ctx, s, func(ctx context.Context) ([]string, error) {
		return queryStrings(ctx, s.pool, `SELECT c.turn_id FROM cancel_requests c JOIN turns t ON t.turn_id = c.turn_id
			WHERE t.status = 'running' AND starts_with(t.owner_id, $1) AND t.owner_id <> $2 ORDER BY t.n`, enginePrefix, suspendedOwner)
	})
}

// CancelReason implements store.CancelReasons.
func (s *Store) CancelReason(ctx context.Context, turnID string) (*budget.CancelError, error) {
	return again(ctx, s, func(ctx context.Context) (*budget.CancelError, error) { return s.cancelReason(ctx, turnID) })
}

func (s *Store) cancelReason(ctx context.Context, turnID string) (*budget.CancelError, error) {
	var reason, by string
	err := s.pool.QueryRow(ctx, `SELECT reason, requested_by FROM cancel_requests WHERE turn_id = $1`, turnID).Scan(&reason, &by)
	switch {
	case isNoRows(err):
		return nil, nil
	case err != nil:
		return nil, err
	}
	ce := &budget.CancelError{Reason: budget.StopReason(reason), By: by}
	if ce.Reason == "" {
		ce.Reason = budget.Cancelled
	}
	return ce, nil
}

var (
	_ store.CancelReasons = (*Store)(nil)
	_ store.Owned         = (*Store)(nil)
)

// listenConn opens the connection that LISTENs for notifications.
func (s *Store) listenConn(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, s.connCfg)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+chanEvents+"; LISTEN "+chanCancel); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// listen dispatches notifications to watchers until the store closes. A
// lost connection is opened again; everything is looked at again then,
// since notifications sent meanwhile are gone.
func (s *Store) listen(conn *pgx.Conn) {
	defer s.bg.Done()
	backoff := 100 * time.Millisecond
	for {
		for {
			n, err := conn.WaitForNotification(s.ctx)
			if err != nil {
				break
			}
			backoff = 100 * time.Millisecond
			if s.dropNotify.Load() {
				continue
			}
			switch n.Channel {
			case chanEvents:
				s.watch.Wake(n.Payload)
			case chanCancel:
				s.cancels.Wake(n.Payload)
				s.cancels.Wake(anyCancel)
			}
		}
		conn.Close(context.Background())
		for {
			if s.ctx.Err() != nil {
				return
			}
			var err error
			if conn, err = s.listenConn(s.ctx); err == nil {
				break
			}
			if s.ctx.Err() == nil {
				s.log.Warn("postgres store: LISTEN connection lost; retrying", "db", s.where, "err", err, "in", backoff)
			}
			select {
			case <-s.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
		}
		s.watch.WakeAll()
		s.checkCancels(s.ctx)
	}
}

// poller wakes every watcher, and looks for cancel requests of the turns
// this store runs, every Options.Poll: what a lost notification would have
// said.
func (s *Store) poller() {
	defer s.bg.Done()
	t := time.NewTicker(s.poll)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			if s.watch.Len() > 0 {
				s.watch.WakeAll()
			}
			s.checkCancels(s.ctx)
		}
	}
}

// checkCancels signals the turns this store runs that have a cancel
// request, or that another store has ended (marked interrupted, taking
// this one for gone): nothing they do can be stored any more.
func (s *Store) checkCancels(ctx context.Context) {
	ids := s.cancels.IDs()
	if len(ids) == 0 {
		return
	}
	rows, err := s.pool.Query(ctx, `SELECT t.turn_id FROM turns t WHERE t.turn_id = ANY($1::text[])
		AND (t.status <> 'running' OR EXISTS (SELECT 1 FROM cancel_requests c WHERE c.turn_id = t.turn_id))`, ids)
	if err != nil {
		return // the next poll tries again
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		if rows.Scan(&id) == nil {
			s.cancels.Wake(id)
		}
	}
}
