package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/timebox-run/timebox/store"
)

// hungAfter is how long the database may answer nothing — no statement of
// the store's, no heartbeat, no probe — before a wait on it is given up
// as on a database that hangs (SIGSTOP, a frozen VM, a stalled disk: it
// takes the statements and answers nothing). It bounds beginning a turn
// and every read (unlessHung). It is not a bound on the wait itself: a
// slow read on a database that answers goes on however long it takes
// (docs/decisions/hung-database-reads.md).
var hungAfter = 5 * time.Second

// probeEvery is how often, while a wait is under way and nothing else has
// answered, the store asks the database whether it answers (SELECT 1 on a
// connection of its own, so that a pool whose connections are all busy
// with slow reads does not pass for a database that hangs).
func probeEvery() time.Duration { return hungAfter / 5 }

// errHung is the cause of a wait given up on a database that answers
// nothing.
var errHung = errors.New("the database answered nothing")

// liveness is when the database last answered, and how many waits are
// under way (they start the probes).
type liveness struct {
	now   func() time.Time // time.Now; tests set another
	mu    sync.Mutex
	last  time.Time
	waits int
	wake  chan struct{} // a wait began: the prober starts (capacity 1)
}

func newLiveness(now func() time.Time) *liveness {
	return &liveness{now: now, last: now(), wake: make(chan struct{}, 1)}
}

// answered notes that the database answered now.
func (l *liveness) answered() {
	l.mu.Lock()
	l.last = l.now()
	l.mu.Unlock()
}

// due is when a wait that began at start is given up, unless the database
// answers before: hungAfter after the later of start and its last answer.
// A wait has hungAfter at least, and as long as the database answers.
func (l *liveness) due(start time.Time) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return later(start, l.last).Add(hungAfter)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// quiet reports how long the database has answered nothing.
func (l *liveness) quiet() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.now().Sub(l.last)
}

func (l *liveness) begin() {
	l.mu.Lock()
	l.waits++
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *liveness) end() {
	l.mu.Lock()
	l.waits--
	l.mu.Unlock()
}

func (l *liveness) waiting() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waits > 0
}

// unlessHung runs fn under a context that is cancelled once the database
// has answered nothing for hungAfter (liveness.due), and then returns
// store.ErrUnavailable: a database that hangs is answered as one that is
// away, within hungAfter, while a slow one that answers its probes is
// waited for. fn's connection is closed by the cancel (pgx's default), so
// nothing it began is left open on the database.
func (s *Store) unlessHung(ctx context.Context, fn func(context.Context) error) error {
	start := s.live.now()
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	s.live.begin()
	defer s.live.end()
	stop, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTimer(hungAfter)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-hctx.Done():
				return
			case <-t.C:
				if rest := s.live.due(start).Sub(s.live.now()); rest > 0 {
					t.Reset(rest)
					continue
				}
				cancel(errHung)
				return
			}
		}
	}()
	err := fn(hctx)
	close(stop)
	<-stopped
	if err != nil && ctx.Err() == nil && errors.Is(context.Cause(hctx), errHung) {
		return fmt.Errorf("%w: the database at %s answered nothing for %s", store.ErrUnavailable, s.where, hungAfter)
	}
	if err == nil || isServerError(err) {
		s.live.answered()
	}
	return err
}

// isServerError reports an error the database answered with.
func isServerError(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe)
}

// prober asks the database whether it answers, every probeEvery while a
// wait is under way and nothing else has answered for that long, on a
// connection of its own (closed once no wait is under way), until the
// store closes. A probe waits as long as the database hangs.
func (s *Store) prober() {
	defer s.bg.Done()
	var conn *pgx.Conn
	drop := func() {
		if conn != nil {
			conn.Close(context.Background())
			conn = nil
		}
	}
	defer drop()
	t := time.NewTicker(probeEvery())
	defer t.Stop()
	for {
		if !s.live.waiting() {
			drop()
			select {
			case <-s.ctx.Done():
				return
			case <-s.live.wake:
			}
		}
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		if !s.live.waiting() || s.live.quiet() < probeEvery() {
			continue
		}
		var err error
		if conn == nil {
			conn, err = pgx.ConnectConfig(s.ctx, s.probeCfg)
		}
		if err == nil {
			_, err = conn.Exec(s.ctx, `SELECT 1`)
		}
		if err == nil || isServerError(err) {
			s.live.answered()
		}
		if err != nil {
			drop()
		}
	}
}
