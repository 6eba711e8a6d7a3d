package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/timebox-run/timebox/store"
)

// transient reports whether a database call failed for a reason that
// passes: the database is away (stopped, restarting, unreachable), the
// connection was cut (pg_terminate_backend), it refuses connections for
// now, or a transaction lost a serialization race or a deadlock. Writes
// that fail so are tried again until they are stored
// (docs/decisions/store-outages.md).
func transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, store.ErrClosed) {
		return false
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case len(pe.Code) == 5 && pe.Code[:2] == "08": // connection exception
			return true
		}
		switch pe.Code {
		case "57P01", "57P02", "57P03", // admin or crash shutdown, cannot connect now
			"53300",          // too many connections
			"40001", "40P01", // serialization failure, deadlock
			"55P03": // lock not available
			return true
		}
		return false
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || pgconn.Timeout(err) || pgconn.SafeToRetry(err) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, context.DeadlineExceeded) ||
		isConnClosed(err)
}

// isConnClosed reports pgx's errors for a connection that died under a
// call.
func isConnClosed(err error) bool {
	var pe *pgconn.PrepareError
	if errors.As(err, &pe) {
		return false
	}
	s := err.Error()
	for _, m := range []string{"conn closed", "connection reset", "broken pipe", "unexpected EOF", "failed to connect", "connection refused"} {
		if strings.Contains(s, m) {
			return true
		}
	}
	return false
}

// Backlog implements store.Backlogged.
func (s *Store) Backlog() store.Backlog { return s.q.Backlog() }

var _ store.Backlogged = (*Store)(nil)

// again runs fn, a read or a write that may be repeated (a cancel request
// is kept once), again at once while it fails on a connection that was
// cut: the pool has dropped it, and the next is likely sound. A database
// that cannot be reached is not tried again here (each try could wait for
// the connection): it is reported at once, as store.ErrUnavailable (503
// store_unavailable at the HTTP API), as is a failure that passes on the
// last try. A database that hangs is given up once it has answered
// nothing for hungAfter (unlessHung), and is store.ErrUnavailable too; a
// slow one that answers is waited for.
//
// It tries once more than the pool holds connections: every one of them
// may have been cut while idle, each found dead only when used (the pool
// pings only those idle for more than a second before it hands them out).
func again[T any](ctx context.Context, s *Store, fn func(context.Context) (T, error)) (T, error) {
	tries := int(s.pool.Config().MaxConns) + 1
	for i := 1; ; i++ {
		var v T
		err := s.unlessHung(ctx, func(ctx context.Context) error {
			var err error
			v, err = fn(ctx)
			return err
		})
		var ce *pgconn.ConnectError
		if err == nil || ctx.Err() != nil || errors.Is(err, store.ErrUnavailable) || !transient(err) {
			return v, err
		}
		if i == tries || errors.As(err, &ce) || errors.Is(err, context.DeadlineExceeded) {
			return v, fmt.Errorf("%w: %w", store.ErrUnavailable, err)
		}
	}
}
