// Package sqlite is the embedded store: one SQLite file (modernc.org/sqlite,
// no cgo) holding sessions, turns, events and records (spec §13).
//
// The file is in WAL mode with synchronous=NORMAL. Events are queued and
// committed in batches by one writer goroutine (group commit): a crashed
// or killed process loses at most what was queued in its last few
// milliseconds, and never a call record, which sinks wait for
// (docs/decisions/group-commit.md). A turn's end is queued behind its
// events and committed by the same writer, in its groups, before
// FinishTurn returns (docs/decisions/turn-ends-in-groups.md). Every other
// write is committed before its method returns; only a power loss may
// lose the last transactions (docs/decisions/store-sqlite.md). Writes go
// through one connection, reads through a small pool, so readers never
// wait for the writer.
//
// Several processes may share a file — `timebox serve` and `timebox run`
// side by side. Each open store registers itself as an owner; a turn
// belongs to the owner that began it. When a store opens, and then at every
// heartbeat, it marks interrupted the running turns whose owner is gone: a
// process that no longer exists, or one silent for longer than the stale
// limit.
package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	_ "modernc.org/sqlite" // the "sqlite" database/sql driver

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/ids"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/internal/groupq"
	"github.com/timebox-run/timebox/store/internal/retry"
	"github.com/timebox-run/timebox/store/internal/watch"
)

// Options tune a Store. The zero value is what `timebox serve` uses.
type Options struct {
	// Heartbeat is how often the store tells other processes sharing the
	// file that it is alive, and looks for turns left running by a process
	// that is gone. Zero is 5s.
	Heartbeat time.Duration
	// Stale is how long an owner on another machine (or where pids cannot
	// be checked) may go without a heartbeat before its running turns are
	// marked interrupted. Zero is 12 heartbeats.
	Stale time.Duration
	// BusyTimeout is how long a write waits for another process's write to
	// finish. Zero is 10s. A group of events that waited this long is
	// committed again, until it is stored.
	BusyTimeout time.Duration
	// Logger gets a line when the store falls behind (events it could not
	// commit yet, kept and retried), when it has caught up, and when the
	// disk is full; nil discards them.
	Logger *slog.Logger
	// Ended, when set, is told of each turn the store marks interrupted
	// (its process is gone), once that is committed — at Open too. It is
	// called on the store's own goroutine: it must not wait on the store.
	Ended func(store.Ending)
}

// Store is a store.Store in one SQLite file. It is safe for concurrent use.
type Store struct {
	path     string
	readOnly bool // OpenReadOnly: only r
	// apart is the apart column of events, turns and messages: '' in a
	// read-only store of a schema before version 6, which has none.
	apart string
	log   *slog.Logger
	// ended is Options.Ended.
	ended func(store.Ending)
	// reserveOnce gives the reserve back once (releaseReserve).
	reserveOnce sync.Once
	w           *sql.DB // the single writer connection
	r           *sql.DB // readers
	owner       string
	machine     string
	hb          time.Duration
	stale       time.Duration

	recovered []string

	// Event appends are queued and committed in groups (groupq).
	q *groupq.Queue
	// prepared are the writer's statements prepared once (wtx).
	prepared map[string]*sql.Stmt

	watch   watch.Set // followers of turns (Watch)
	cancels watch.Set // turns this store runs (WatchCancel)

	stop      chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closeErr  error
	closed    chan struct{}
}

const (
	// maxGroup bounds how many event appends share one transaction.
	maxGroup = 1024
)

var _ store.Store = (*Store)(nil)

// liveOwners are the owner ids of the stores open in this process, which a
// pid check cannot tell apart.
var liveOwners sync.Map

// Open opens (creating it if needed) the store at path, migrates it to
// SchemaVersion, and marks interrupted the turns left running by processes
// that are gone (Recovered lists them). It returns an error if the file
// cannot be opened or was made by a newer timebox.
func Open(path string, o Options) (*Store, error) {
	if path == "" {
		return nil, errors.New("sqlite: empty path")
	}
	if strings.ContainsAny(path, "?#") {
		return nil, fmt.Errorf("sqlite: %q: a store path may not contain ? or #", path)
	}
	if err := notAFile(path); err != nil {
		return nil, err
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = 5 * time.Second
	}
	if o.Stale <= 0 {
		o.Stale = 12 * o.Heartbeat
	}
	if o.BusyTimeout <= 0 {
		o.BusyTimeout = 10 * time.Second
	}
	busy := fmt.Sprintf("_pragma=busy_timeout(%d)", o.BusyTimeout.Milliseconds())
	// _txlock=immediate: a write transaction takes the write lock when it
	// begins, so it waits (busy_timeout) instead of failing when it would
	// upgrade a read lock another process's write made stale.
	w, err := sql.Open("sqlite", path+"?"+busy+"&_pragma=journal_mode(WAL)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)&_txlock=immediate")
	if err != nil {
		return nil, err
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	ctx := context.Background()
	if err := migrate(ctx, w, path); err != nil {
		w.Close()
		return nil, fmt.Errorf("opening store %s: %w", path, notADatabase(err))
	}
	r, err := sql.Open("sqlite", path+"?"+busy+"&_pragma=query_only(1)")
	if err != nil {
		w.Close()
		return nil, err
	}
	r.SetMaxOpenConns(4)
	r.SetMaxIdleConns(4)
	s := &Store{path: path, apart: "apart", w: w, r: r, log: o.Logger, ended: o.Ended, owner: newID(), machine: machineID(), hb: o.Heartbeat, stale: o.Stale,
		stop: make(chan struct{}), done: make(chan struct{}), closed: make(chan struct{})}
	if s.prepared, err = prepare(ctx, w); err != nil {
		s.closeDBs()
		return nil, err
	}
	start, _ := processStart(os.Getpid())
	now := time.Now()
	if _, err := w.ExecContext(ctx, `INSERT INTO owners (owner_id, pid, pid_start, machine, started_at, heartbeat_at) VALUES (?, ?, ?, ?, ?, ?)`,
		s.owner, os.Getpid(), start, s.machine, now.UnixNano(), now.UnixNano()); err != nil {
		s.closeDBs()
		return nil, fmt.Errorf("opening store %s: %w", path, err)
	}
	liveOwners.Store(s.owner, true)
	s.recovered, err = s.recover(ctx)
	if err != nil {
		liveOwners.Delete(s.owner)
		s.closeDBs()
		return nil, fmt.Errorf("opening store %s: marking interrupted turns: %w", path, err)
	}
	s.q = groupq.New(s.commitGroup, groupq.Options{MaxGroup: maxGroup, Transient: transient,
		Encode: store.EncodeEvent, OnState: groupq.Log(o.Logger, "sqlite store "+path)})
	s.keepReserve()
	go s.heartbeat()
	return s, nil
}

// OpenReadOnly opens the store at path to read it only: no migration, no
// owner, no recovery, no writes — what `timebox runs` needs, and all a
// store on a full disk can give. It returns an error if the file is not
// there or not a store of this timebox.
func OpenReadOnly(path string) (*Store, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, err
	}
	if err := notAFile(path); err != nil {
		return nil, err
	}
	r, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=query_only(1)&_pragma=busy_timeout(10000)")
	if err != nil {
		return nil, err
	}
	r.SetMaxOpenConns(4)
	var v int
	if err := r.QueryRow("PRAGMA user_version").Scan(&v); err != nil {
		r.Close()
		return nil, fmt.Errorf("opening store %s: %w", path, notADatabase(err))
	}
	if v > SchemaVersion || v == 0 {
		r.Close()
		return nil, fmt.Errorf("opening store %s: schema version %d, this timebox reads %d", path, v, SchemaVersion)
	}
	apart := "apart"
	if v < 6 {
		apart = "''"
	}
	return &Store{path: path, r: r, readOnly: true, apart: apart, stop: make(chan struct{}), done: make(chan struct{}), closed: make(chan struct{})}, nil
}

// notAFile says that path is a directory (or another thing than a file),
// which SQLite words as "unable to open database file (14)".
func notAFile(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return nil // a new store, or SQLite says why not
	case fi.IsDir():
		return fmt.Errorf("opening store %s: it is a directory (name the store's file, such as %s)", path, filepath.Join(path, "timebox.db"))
	case !fi.Mode().IsRegular():
		return fmt.Errorf("opening store %s: it is not a regular file (name the store's file, such as ./timebox.db)", path)
	}
	return nil
}

// errNotADatabase is what notADatabase makes of SQLITE_NOTADB.
var errNotADatabase = errors.New("the file is not a SQLite database, so not a store of timebox's (name the store's file, or a new one for timebox to make)")

// notADatabase words SQLITE_NOTADB ("file is not a database (26)") for a
// person who gave --db another file; other errors are as they are.
func notADatabase(err error) error {
	var ce interface{ Code() int }
	if errors.As(err, &ce) && ce.Code()&0xff == 26 {
		return errNotADatabase
	}
	return err
}

func newID() string { return ids.New("") }

// Path returns the file the store was opened at.
func (s *Store) Path() string { return s.path }

// Recovered returns the ids of the turns Open marked interrupted.
func (s *Store) Recovered() []string { return append([]string(nil), s.recovered...) }

// pollEvery is how often watchers (Watch) are told to look again, for
// what other processes sharing the file wrote: this store knows at once
// only of its own writes.
const pollEvery = 250 * time.Millisecond

func (s *Store) heartbeat() {
	defer close(s.done)
	t := time.NewTicker(s.hb)
	defer t.Stop()
	poll := time.NewTicker(pollEvery)
	defer poll.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-poll.C:
			s.watch.WakeAll()
		case <-t.C:
			ctx := context.Background()
			// Errors here are transient (a busy file) or will show on the
			// next real write; the next tick tries again.
			_, _ = s.w.ExecContext(ctx, `UPDATE owners SET heartbeat_at = ? WHERE owner_id = ?`, time.Now().UnixNano(), s.owner)
			_, _ = s.recover(ctx)
		}
	}
}

func (s *Store) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// Close marks this store's running turns interrupted, removes it as an
// owner and closes the file. It is idempotent and safe for concurrent use;
// methods called after it return store.ErrClosed.
func (s *Store) Close() error {
	if s.readOnly {
		s.closeOnce.Do(func() {
			close(s.closed)
			s.closeErr = s.r.Close()
		})
		return s.closeErr
	}
	s.closeOnce.Do(func() {
		s.stopWriters()
		ctx := context.Background()
		err := s.interruptOwner(ctx, s.owner, "the store was closed while the turn was running")
		if err == nil {
			_, err = s.w.ExecContext(ctx, `DELETE FROM owners WHERE owner_id = ?`, s.owner)
		}
		liveOwners.Delete(s.owner)
		s.closeErr = errors.Join(err, s.closeDBs())
	})
	return s.closeErr
}

// stopWriters refuses new writes, lets the appends already queued commit,
// and stops the background goroutines.
func (s *Store) stopWriters() {
	close(s.closed)
	s.q.Close()
	close(s.stop)
	<-s.done
}

func (s *Store) closeDBs() error {
	var err error
	if s.prepared != nil {
		err = closePrepared(s.prepared)
	}
	return errors.Join(err, s.r.Close(), s.w.Close())
}

// tx runs fn in a write transaction.
func (s *Store) tx(ctx context.Context, fn func(*wtx) error) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	err := s.tx1(ctx, fn)
	if isFull(err) && s.releaseReserve() {
		err = s.tx1(ctx, fn) // with the room the reserve made
	}
	if isFull(err) {
		return fmt.Errorf("%w: %w", ErrDiskFull, err)
	}
	return err
}

// durable runs fn in a write transaction until it commits: again, after a
// backoff, while another process holds the file's lock past BusyTimeout,
// until ctx ends or the store is closed. A turn's end and a late result go
// through it (docs/decisions/store-outages.md).
func (s *Store) durable(ctx context.Context, what string, fn func(*wtx) error) error {
	return retry.Do(ctx, retry.Policy{Transient: transient, Stop: s.closed, Log: s.log, What: "sqlite store: " + what, Attrs: []any{"path", s.path},
		Stopped: func(err error) error {
			return fmt.Errorf("%w while %s could not be stored: %w", store.ErrClosed, what, err)
		}}, func() error { return s.tx(ctx, fn) })
}

func (s *Store) tx1(ctx context.Context, fn func(*wtx) error) error {
	if s.w == nil {
		return errReadOnly
	}
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(&wtx{Tx: tx, prepared: s.prepared}); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// ErrDiskFull is returned (wrapped) by a write that failed because the disk
// holding the store is full, once the store's reserve was spent.
var ErrDiskFull = errors.New("the disk holding the store is full")

var errReadOnly = errors.New("sqlite: the store was opened read-only")

// reserveSize is the room a store keeps beside its file (path.reserve)
// and gives back when the disk is full, so that the ends of the turns
// running then can still be written (FinishTurn stores at least the
// turn's record) and its closing can mark what is left.
const reserveSize = 512 << 10

// keepReserve makes the reserve file if it is not there: best effort (a
// disk already full has no room for it).
func (s *Store) keepReserve() {
	p := s.path + ".reserve"
	if fi, err := os.Stat(p); err == nil && fi.Size() >= reserveSize {
		return
	}
	if err := os.WriteFile(p, make([]byte, reserveSize), 0o600); err != nil {
		os.Remove(p)
	}
}

// releaseReserve removes the reserve file, once: it reports whether that
// made room.
func (s *Store) releaseReserve() bool {
	released := false
	s.reserveOnce.Do(func() {
		if err := os.Remove(s.path + ".reserve"); err == nil {
			released = true
			if s.log != nil {
				s.log.Warn("sqlite store: the disk is full; gave back the room kept in reserve so that the turns' ends can be written. Free space on the disk of "+s.path, "reserve", reserveSize)
			}
		}
	})
	return released
}

func isFull(err error) bool {
	var ce interface{ Code() int }
	return errors.As(err, &ce) && ce.Code()&0xff == 13 // SQLITE_FULL
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// transient reports whether a write failed for a reason that passes:
// another process holds the file's lock past BusyTimeout.
func transient(err error) bool {
	var ce interface{ Code() int }
	if !errors.As(err, &ce) {
		return false
	}
	switch ce.Code() & 0xff {
	case 5, 6: // SQLITE_BUSY, SQLITE_LOCKED
		return true
	}
	return false
}

// Backlog implements store.Backlogged.
func (s *Store) Backlog() store.Backlog {
	if s.readOnly {
		return store.Backlog{}
	}
	return s.q.Backlog()
}

func isFK(err error) bool {
	return err != nil && strings.Contains(err.Error(), "FOREIGN KEY constraint failed")
}

const touchSessionSQL = `INSERT INTO sessions (session_id, created_at, updated_at) VALUES (?1, ?2, ?2)
		ON CONFLICT (session_id) DO UPDATE SET updated_at = max(updated_at, excluded.updated_at)`

func touchSession(ctx context.Context, tx *wtx, id string, at time.Time) error {
	_, err := tx.exec(ctx, touchSessionSQL, id, nanos(at))
	return err
}

// BeginTurn implements store.Store.
func (s *Store) BeginTurn(ctx context.Context, t store.TurnStart) error {
	err := s.tx(ctx, func(tx *wtx) error {
		return s.begin(ctx, tx, t, true)
	})
	if transient(err) {
		return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
	}
	return err
}

// begin inserts a running turn; exclusive refuses it while its session has
// another turn running (store.ErrSessionBusy).
func (s *Store) begin(ctx context.Context, tx *wtx, t store.TurnStart, exclusive bool) error {
	var one int
	switch err := tx.QueryRowContext(ctx, `SELECT 1 FROM turns WHERE turn_id = ?`, t.TurnID).Scan(&one); {
	case err == nil:
		return fmt.Errorf("turn %s: %w", t.TurnID, store.ErrExists)
	case !errors.Is(err, sql.ErrNoRows):
		return err
	}
	if t.StartedAt.IsZero() {
		t.StartedAt = time.Now()
	}
	if t.SessionID != "" && exclusive {
		var busy string
		switch err := tx.QueryRowContext(ctx, `SELECT turn_id FROM turns WHERE session_id = ? AND status = 'running' LIMIT 1`,
			t.SessionID).Scan(&busy); {
		case err == nil:
			return fmt.Errorf("session %s: %w (%s)", t.SessionID, store.ErrSessionBusy, busy)
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
	}
	if t.SessionID != "" {
		if err := touchSession(ctx, tx, t.SessionID, t.StartedAt); err != nil {
			return err
		}
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO turns (turn_id, session_id, agent, input, status, started_at, owner_id)
		VALUES (?, ?, ?, ?, ?, ?, ?)`, t.TurnID, t.SessionID, t.Agent, t.Input, budget.StatusRunning, nanos(t.StartedAt), s.owner)
	return err
}

// AppendEvent implements store.Store: it queues e and waits for the
// commit of its batch.
func (s *Store) AppendEvent(ctx context.Context, e event.Event) error {
	done := make(chan error, 1)
	s.QueueEvent(e, func(err error) { done <- err })
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// QueueEvent implements store.Store. The event is encoded on the caller's
// goroutine; the writer commits what is queued whenever it is free, so
// appends from concurrent turns, and the events one turn emits while a
// commit is under way, share one transaction.
func (s *Store) QueueEvent(e event.Event, committed func(error)) {
	if s.readOnly {
		if committed != nil {
			committed(errReadOnly)
		}
		return
	}
	if e.Seq <= 0 {
		if committed != nil {
			committed(fmt.Errorf("turn %s: event %s has no seq: SQLite does not number events (use PostgreSQL for an engine that needs it)", e.TurnID, e.Type))
		}
		return
	}
	s.q.Add(e, func(err error) {
		if err == nil {
			s.watch.Wake(e.TurnID)
		} else if isFull(err) {
			// The reserve is kept for the turns' ends (tx).
			err = fmt.Errorf("%w: %w", ErrDiskFull, err)
		}
		if committed != nil {
			committed(err)
		}
	})
}

// Flush implements store.Store.
func (s *Store) Flush(ctx context.Context) error {
	if s.readOnly {
		return nil
	}
	return s.q.Flush(ctx)
}

// commitGroup writes a group of appends, and the turns' ends queued among
// them, in one transaction.
func (s *Store) commitGroup(group []*groupq.Item) error {
	ctx := context.Background()
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	wt := &wtx{Tx: tx, prepared: s.prepared}
	for _, it := range group {
		var err error
		if e, ok := it.Work.(*end); ok {
			err = s.finish(ctx, wt, e.rec, e.msgs)
		} else {
			err = appendOne(ctx, wt, it)
		}
		if err != nil {
			tx.Rollback()
			return err
		}
	}
	return tx.Commit()
}

func appendOne(ctx context.Context, tx *wtx, it *groupq.Item) error {
	e := it.Event
	_, a := store.StoredEvent(e)
	res, err := tx.exec(ctx, insertEventSQL, e.TurnID, e.Seq, e.Type, nanos(e.At), it.Data, a.Column())
	if isFK(err) {
		return fmt.Errorf("turn %s: %w", e.TurnID, store.ErrNotFound)
	}
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return err // a seq already stored: nothing more to do
	}
	if err := putTexts(ctx, tx, e.TurnID, a); err != nil {
		return err
	}
	tc, mc := store.CallRecords(e)
	if tc != nil {
		if err := putToolCall(ctx, tx, *tc); err != nil {
			return err
		}
	}
	if mc != nil {
		if err := addModelCall(ctx, tx, e.TurnID, *mc); err != nil {
			return err
		}
	}
	return nil
}

const insertEventSQL = `INSERT OR IGNORE INTO events (turn_id, seq, type, at, data, apart) VALUES (?, ?, ?, ?, ?, ?)`

// insertEvent stores e, its long texts apart, unless its seq is stored.
func insertEvent(ctx context.Context, tx *wtx, e event.Event) (bool, error) {
	e, a := store.StoredEvent(e)
	data, err := event.Marshal(e)
	if err != nil {
		return false, err
	}
	res, err := tx.exec(ctx, insertEventSQL, e.TurnID, e.Seq, e.Type, nanos(e.At), data, a.Column())
	if isFK(err) {
		return false, fmt.Errorf("turn %s: %w", e.TurnID, store.ErrNotFound)
	}
	if err != nil {
		return false, err
	}
	n, err := res.RowsAffected()
	if n == 0 || err != nil {
		return false, err
	}
	return true, putTexts(ctx, tx, e.TurnID, a)
}

const putToolCallSQL = `INSERT INTO tool_calls (turn_id, call_id, tool, outcome, started_at, duration_ms, late_result, record,
			timeout_ms, idle_timeout_ms, phase, refused, overran, abandoned, progress_count, sample_ms, silence_ms)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (turn_id, call_id) DO UPDATE SET tool = excluded.tool, outcome = excluded.outcome,
			started_at = excluded.started_at, duration_ms = excluded.duration_ms,
			late_result = excluded.late_result, record = excluded.record,
			timeout_ms = excluded.timeout_ms, idle_timeout_ms = excluded.idle_timeout_ms, phase = excluded.phase,
			refused = excluded.refused, overran = excluded.overran, abandoned = excluded.abandoned,
			progress_count = excluded.progress_count, sample_ms = excluded.sample_ms, silence_ms = excluded.silence_ms
		WHERE NOT (tool_calls.late_result = 1 AND excluded.late_result = 0)`

func putToolCall(ctx context.Context, tx *wtx, tc event.ToolCall) error {
	rec, err := json.Marshal(tc)
	if err != nil {
		return err
	}
	sample, silence, err := toolSample(ctx, tx, tc)
	if err != nil {
		return err
	}
	// The WHERE keeps a late result (store.KeepLate) that the turn's
	// final record, written after it, does not know of.
	_, err = tx.exec(ctx, putToolCallSQL,
		tc.TurnID, tc.CallID, tc.Tool, tc.Outcome, nanos(tc.StartedAt), tc.DurationMS, tc.LateResult, rec,
		tc.TimeoutMS, tc.IdleTimeoutMS, tc.Phase, tc.Refused, tc.Overran, tc.Abandoned, tc.ProgressCount, sample, silence)
	if isFK(err) {
		return fmt.Errorf("turn %s: %w", tc.TurnID, store.ErrNotFound)
	}
	return err
}

// toolSample returns what timebox stats reads of a tool call: its
// duration when it enters its tool's percentiles (store.ToolSample) and
// its longest silence (store.LongestSilence), measured from its stored
// progress events; nil when it does not.
func toolSample(ctx context.Context, tx *wtx, tc event.ToolCall) (sample, silence any, err error) {
	ms, ok := store.ToolSample(tc)
	if !ok {
		return nil, nil, nil
	}
	var reports []time.Time
	if tc.ProgressCount > 0 {
		rows, err := tx.QueryContext(ctx, `SELECT at FROM events INDEXED BY events_progress
			WHERE turn_id = ? AND type = 'tool_progress' AND instr(data, ?) > 0`, tc.TurnID, store.ProgressPattern(tc.CallID))
		if err != nil {
			return nil, nil, err
		}
		defer rows.Close()
		for rows.Next() {
			var at int64
			if err := rows.Scan(&at); err != nil {
				return nil, nil, err
			}
			reports = append(reports, fromNanos(at))
		}
		if err := rows.Err(); err != nil {
			return nil, nil, err
		}
	}
	return ms, store.ToolSilence(tc, reports), nil
}

const addModelCallSQL = `INSERT INTO model_calls (turn_id, idx, step, model, outcome, record,
			provider, started_at, phase, sample_phase, sample_ms)
		VALUES (?1, (SELECT COALESCE(MAX(idx), -1) + 1 FROM model_calls WHERE turn_id = ?1), ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)`

func addModelCall(ctx context.Context, tx *wtx, turnID string, mc event.ModelCall) error {
	rec, err := json.Marshal(mc)
	if err != nil {
		return err
	}
	phase, ms, ok := store.ModelSample(mc)
	var sample any
	if ok {
		sample = ms
	}
	_, err = tx.exec(ctx, addModelCallSQL,
		turnID, mc.Step, mc.Model, mc.Outcome, rec, mc.Provider, nanos(mc.StartedAt), mc.Phase, phase, sample)
	return err
}

// putRecord stores a turn's end — its status, message and record — with
// its long texts apart.
const putRecordSQL = `UPDATE turns SET status = ?, stop_reason = ?, message = ?, ended_at = ?,
		wall_ms = ?, steps = ?, record = ?, apart = ? WHERE turn_id = ?`

func putRecord(ctx context.Context, tx *wtx, rec *event.Turn) error {
	stored, a := store.RecordApart(rec)
	final, err := store.FinalRecord(stored)
	if err != nil {
		return err
	}
	if err := putTexts(ctx, tx, rec.TurnID, a); err != nil {
		return err
	}
	_, err = tx.exec(ctx, putRecordSQL,
		rec.Status, rec.StopReason, stored.Message, nanos(rec.EndedAt), rec.WallMS, rec.Steps, final, a.Column(), rec.TurnID)
	return err
}

// end is a turn's end, queued for the writer (FinishTurn).
type end struct {
	rec  *event.Turn
	msgs []model.Message
}

// FinishTurn implements store.Store. The turn's end is queued behind its
// events and committed by the writer with whatever else is waiting, in one
// transaction: 10,000 turns that end at once share a few commits instead
// of waiting for 10,000 one after the other
// (docs/decisions/turn-ends-in-groups.md). When ctx ends first it returns
// ctx's error, and the end stays queued.
func (s *Store) FinishTurn(ctx context.Context, rec *event.Turn, msgs []model.Message) error {
	if s.readOnly {
		return errReadOnly
	}
	defer s.watch.Wake(rec.TurnID)
	done := make(chan error, 1)
	s.q.Do(&end{rec: rec, msgs: msgs}, func(err error) { done <- err })
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	if !isFull(err) {
		return err
	}
	// The disk is full: alone, with the room the reserve makes (tx).
	err = s.durable(ctx, "the record of turn "+rec.TurnID, func(tx *wtx) error { return s.finish(ctx, tx, rec, msgs) })
	if !errors.Is(err, ErrDiskFull) {
		return err
	}
	// The disk is full, the reserve spent: the turn's end at least — its
	// status, its message saying what could not be stored, its answer —
	// so that it is not taken for the crash of a process that stopped.
	short := *rec
	short.Message += " (The store's disk is full: this turn's events, call records and messages could not all be stored.)"
	final, ferr := store.FinalRecord(&short)
	if ferr != nil {
		return err
	}
	if _, werr := s.w.ExecContext(ctx, `UPDATE turns SET status = ?, stop_reason = ?, message = ?, ended_at = ?,
		wall_ms = ?, steps = ?, record = ?, apart = '' WHERE turn_id = ? AND status = 'running'`,
		short.Status, short.StopReason, short.Message, nanos(short.EndedAt), short.WallMS, short.Steps, final, short.TurnID); werr != nil {
		return fmt.Errorf("%w (and its end could not be stored either: %v)", err, werr)
	}
	return fmt.Errorf("%w: the turn's end was stored without its events and records", err)
}

// The statements of a turn's end (finish) that are not a function's own.
const (
	turnExistsSQL       = `SELECT 1 FROM turns WHERE turn_id = ?`
	storedSeqsSQL       = `SELECT seq FROM events WHERE turn_id = ? ORDER BY seq`
	deleteModelCallsSQL = `DELETE FROM model_calls WHERE turn_id = ?`
	deleteMessagesSQL   = `DELETE FROM messages WHERE turn_id = ?`
	insertMessageSQL    = `INSERT INTO messages (session_id, turn_id, message, apart) VALUES (?, ?, ?, ?)`
)

// finish writes a turn's end in tx: the events of its log the queue did
// not store, its call records, its record and its session messages.
func (s *Store) finish(ctx context.Context, tx *wtx, rec *event.Turn, msgs []model.Message) error {
	var one int
	err := tx.queryRow(ctx, turnExistsSQL, rec.TurnID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		err = s.begin(ctx, tx, store.TurnStart{TurnID: rec.TurnID, SessionID: rec.SessionID, Agent: rec.Agent,
			Input: rec.Input, StartedAt: rec.StartedAt}, false)
	}
	if err != nil {
		return err
	}
	stored, err := storedSeqs(ctx, tx, rec)
	if err != nil {
		return err
	}
	// Only what the queue has not stored is written: as a rule no event
	// (a turn's log may hold a long reply's every delta, issue 29) and no
	// call record.
	w := store.EndOf(rec, stored)
	for _, e := range w.Events {
		e.TurnID = rec.TurnID
		if _, err := insertEvent(ctx, tx, e); err != nil {
			return err
		}
	}
	for _, tc := range w.ToolCalls {
		tc.TurnID = rec.TurnID
		if err := putToolCall(ctx, tx, tc); err != nil {
			return err
		}
	}
	if w.ModelCalls {
		if _, err := tx.exec(ctx, deleteModelCallsSQL, rec.TurnID); err != nil {
			return err
		}
		for _, mc := range rec.ModelCalls {
			if err := addModelCall(ctx, tx, rec.TurnID, mc); err != nil {
				return err
			}
		}
	}
	if err := putRecord(ctx, tx, rec); err != nil {
		return err
	}
	if rec.SessionID == "" {
		return nil
	}
	if err := touchSession(ctx, tx, rec.SessionID, rec.EndedAt); err != nil {
		return err
	}
	if _, err := tx.exec(ctx, deleteMessagesSQL, rec.TurnID); err != nil {
		return err
	}
	for i, m := range msgs {
		m, a := store.MessageApart(m, i, rec.Answer)
		if err := putTexts(ctx, tx, rec.TurnID, a); err != nil {
			return err
		}
		b, err := json.Marshal(m)
		if err != nil {
			return err
		}
		if _, err := tx.exec(ctx, insertMessageSQL, rec.SessionID, rec.TurnID, b, a.Column()); err != nil {
			return err
		}
	}
	return nil
}

// storedSeqs returns the seqs of rec's events the store holds, in
// ascending order: all of them, not the last, since a group of events the
// queue failed to store (a full disk) may lie before one it stored.
func storedSeqs(ctx context.Context, tx *wtx, rec *event.Turn) ([]int64, error) {
	if len(rec.Events) == 0 {
		return nil, nil
	}
	rows, err := tx.query(ctx, storedSeqsSQL, rec.TurnID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	seqs := make([]int64, 0, len(rec.Events))
	for rows.Next() {
		var seq int64
		if err := rows.Scan(&seq); err != nil {
			return nil, err
		}
		seqs = append(seqs, seq)
	}
	return seqs, rows.Err()
}

// Watch implements store.Store: this store's own commits are signalled at
// once; what another process sharing the file writes is picked up every
// 250ms.
func (s *Store) Watch(turnID string) (<-chan struct{}, func()) { return s.watch.Add(turnID) }

// RequestCancel implements store.Store. SQLite carries a request only to a
// turn this store runs (whose WatchCancel is registered); a turn another
// process runs is store.ErrNotHere: cancel it there
// (docs/decisions/many-gateways.md).
func (s *Store) RequestCancel(ctx context.Context, turnID string) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	var status, owner string
	err := s.r.QueryRowContext(ctx, `SELECT status, owner_id FROM turns WHERE turn_id = ?`, turnID).Scan(&status, &owner)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("turn %s: %w", turnID, store.ErrNotFound)
	case err != nil:
		return err
	case status != string(budget.StatusRunning):
		return fmt.Errorf("turn %s: %w", turnID, store.ErrNotRunning)
	case owner != s.owner || !s.cancels.Watched(turnID):
		return fmt.Errorf("turn %s: %w", turnID, store.ErrNotHere)
	}
	s.cancels.Wake(turnID)
	return nil
}

// WatchCancel implements store.Store.
func (s *Store) WatchCancel(turnID string) (<-chan struct{}, func()) { return s.cancels.Add(turnID) }

// UpdateToolCall implements store.Store.
func (s *Store) UpdateToolCall(ctx context.Context, rec event.ToolCall) error {
	return s.durable(ctx, "a late result of turn "+rec.TurnID, func(tx *wtx) error { return putToolCall(ctx, tx, rec) })
}

// Turn implements store.Store.
func (s *Store) Turn(ctx context.Context, id string) (*event.Turn, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	// One read transaction, so the turn and its calls are one snapshot.
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	var (
		rec     event.Turn
		started int64
		ended   sql.NullInt64
		final   sql.NullString
		kept    string
	)
	err = tx.QueryRowContext(ctx, `SELECT turn_id, session_id, agent, input, status, stop_reason, message, started_at,
		ended_at, wall_ms, steps, record, `+s.apart+` FROM turns WHERE turn_id = ?`, id).Scan(&rec.TurnID, &rec.SessionID, &rec.Agent,
		&rec.Input, &rec.Status, &rec.StopReason, &rec.Message, &started, &ended, &rec.WallMS, &rec.Steps, &final, &kept)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("turn %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	if final.Valid {
		rec = event.Turn{}
		if err := json.Unmarshal([]byte(final.String), &rec); err != nil {
			return nil, fmt.Errorf("turn %s: reading its record: %w", id, err)
		}
		if a := store.ParseApart(kept); len(a) > 0 {
			texts, err := readTexts(ctx, tx, id, a)
			if err != nil {
				return nil, fmt.Errorf("turn %s: reading its record's texts: %w", id, err)
			}
			store.FillRecord(&rec, a, texts)
		}
	} else {
		rec.StartedAt = fromNanos(started)
		if ended.Valid {
			rec.EndedAt = fromNanos(ended.Int64)
		}
	}
	rec.ToolCalls, err = scanJSON[event.ToolCall](ctx, tx, `SELECT record FROM tool_calls WHERE turn_id = ? ORDER BY started_at, call_id`, id)
	if err != nil {
		return nil, err
	}
	rec.ModelCalls, err = scanJSON[event.ModelCall](ctx, tx, `SELECT record FROM model_calls WHERE turn_id = ? ORDER BY idx`, id)
	if err != nil {
		return nil, err
	}
	if rec.Status == budget.StatusRunning {
		for _, mc := range rec.ModelCalls {
			rec.Steps = max(rec.Steps, mc.Step)
		}
	}
	return &rec, nil
}

func scanJSON[T any](ctx context.Context, tx *sql.Tx, query string, args ...any) ([]T, error) {
	rows, err := tx.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []T{}
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return nil, err
		}
		var v T
		if err := json.Unmarshal(b, &v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// summaryColumns select a store.TurnSummary from turns t (scanSummary).
const summaryColumns = `t.turn_id, t.session_id, t.agent, substr(t.input, 1, 300), t.status, t.stop_reason, t.message,
	t.started_at, t.ended_at, t.wall_ms, t.steps,
	(SELECT COUNT(*) FROM tool_calls c WHERE c.turn_id = t.turn_id),
	(SELECT COALESCE(MAX(seq), 0) FROM events e WHERE e.turn_id = t.turn_id),
	(SELECT COALESCE(MAX(step), 0) FROM model_calls m WHERE m.turn_id = t.turn_id)`

// selectSummaries is SELECT summaryColumns and the turn's apart column.
func (s *Store) selectSummaries() string {
	if s.apart == "apart" {
		return "SELECT " + summaryColumns + ", t.apart"
	}
	return "SELECT " + summaryColumns + ", ''"
}

func scanSummary(rows *sql.Rows) (store.TurnSummary, store.Apart, error) {
	var (
		ts       store.TurnSummary
		started  int64
		ended    sql.NullInt64
		runSteps int
		kept     string
	)
	err := rows.Scan(&ts.TurnID, &ts.SessionID, &ts.Agent, &ts.Input, &ts.Status, &ts.StopReason, &ts.Message,
		&started, &ended, &ts.WallMS, &ts.Steps, &ts.ToolCalls, &ts.Events, &runSteps, &kept)
	ts.Input = store.ShortInput(ts.Input)
	ts.StartedAt = fromNanos(started)
	if ended.Valid {
		t := fromNanos(ended.Int64)
		ts.EndedAt = &t
	}
	if ts.Status == budget.StatusRunning {
		ts.Steps = runSteps
	}
	return ts, store.ParseApart(kept), err
}

func (s *Store) summaries(ctx context.Context, query string, args ...any) ([]store.TurnSummary, error) {
	rows, err := s.r.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return store.ReadRows(rows, func() { rows.Close() }, func() (store.TurnSummary, string, store.Apart, bool, error) {
		ts, a, err := scanSummary(rows)
		return ts, ts.TurnID, a, true, err
	}, func(id string, a store.Apart) (map[string]string, error) {
		return readTexts(ctx, s.r, id, a)
	}, func(ts *store.TurnSummary, a store.Apart, texts map[string]string) {
		store.FillMessage(&ts.Message, a, texts)
	})
}

// Turns implements store.Store.
func (s *Store) Turns(ctx context.Context, f store.Filter) ([]store.TurnSummary, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	var where []string
	var args []any
	if f.Status != "" {
		where, args = append(where, "t.status = ?"), append(args, f.Status)
	}
	if f.StopReason != "" {
		where, args = append(where, "t.stop_reason = ?"), append(args, f.StopReason)
	}
	if f.SessionID != "" {
		where, args = append(where, "t.session_id = ?"), append(args, f.SessionID)
	}
	if f.Before != "" {
		var n int64
		err := s.r.QueryRowContext(ctx, `SELECT n FROM turns WHERE turn_id = ?`, f.Before).Scan(&n)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("turn %s: %w", f.Before, store.ErrNotFound)
		}
		if err != nil {
			return nil, err
		}
		where, args = append(where, "t.n < ?"), append(args, n)
	}
	q := s.selectSummaries() + " FROM turns t"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	q += " ORDER BY t.n DESC LIMIT ?"
	return s.summaries(ctx, q, append(args, store.ClampLimit(f.Limit))...)
}

// Events implements store.Store.
func (s *Store) Events(ctx context.Context, turnID string, after int64, limit int) ([]event.Event, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	if limit <= 0 {
		limit = -1 // SQLite: no limit
	}
	out, err := readEvents(ctx, s.r, s.apart, turnID, after, limit, false)
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		var one int
		err := s.r.QueryRowContext(ctx, `SELECT 1 FROM turns WHERE turn_id = ?`, turnID).Scan(&one)
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("turn %s: %w", turnID, store.ErrNotFound)
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// readEvents reads turnID's events after seq after, at most limit (-1: all),
// their long texts in place. apartCol is the apart column (Store.apart). An
// event that cannot be read is an error, or skipped when skipBad.
func readEvents(ctx context.Context, q querier, apartCol, turnID string, after int64, limit int, skipBad bool) ([]event.Event, error) {
	rows, err := q.QueryContext(ctx, `SELECT data, `+apartCol+` FROM events WHERE turn_id = ? AND seq > ? ORDER BY seq LIMIT ?`, turnID, after, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return store.ReadEvents(rows, func() { rows.Close() }, turnID, skipBad, func(id string, a store.Apart) (map[string]string, error) {
		return readTexts(ctx, q, id, a)
	})
}

// Session implements store.Store.
func (s *Store) Session(ctx context.Context, id string) (*store.Session, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	var created, updated int64
	err := s.r.QueryRowContext(ctx, `SELECT created_at, updated_at FROM sessions WHERE session_id = ?`, id).Scan(&created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("session %s: %w", id, store.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	out := &store.Session{SessionID: id, CreatedAt: fromNanos(created), UpdatedAt: fromNanos(updated)}
	out.Turns, err = s.summaries(ctx, s.selectSummaries()+" FROM turns t WHERE t.session_id = ? ORDER BY t.n", id)
	if err != nil {
		return nil, err
	}
	out.Messages, err = s.messages(ctx, id)
	if err != nil {
		return nil, err
	}
	return out, nil
}

// messages reads a session's conversation, its long contents in place.
func (s *Store) messages(ctx context.Context, sessionID string) ([]store.Message, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT turn_id, message, `+s.apart+` FROM messages WHERE session_id = ? ORDER BY id`, sessionID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return store.ReadMessages(rows, func() { rows.Close() }, func(id string, a store.Apart) (map[string]string, error) {
		return readTexts(ctx, s.r, id, a)
	})
}

// Sessions implements store.Store.
func (s *Store) Sessions(ctx context.Context, limit int) ([]store.SessionSummary, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	rows, err := s.r.QueryContext(ctx, `SELECT s.session_id, s.created_at, s.updated_at,
		(SELECT COUNT(*) FROM turns t WHERE t.session_id = s.session_id),
		COALESCE((SELECT substr(t.input, 1, 300) FROM turns t WHERE t.session_id = s.session_id ORDER BY t.n LIMIT 1), '')
		FROM sessions s ORDER BY s.updated_at DESC, s.rowid DESC LIMIT ?`, store.ClampLimit(limit))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []store.SessionSummary{}
	for rows.Next() {
		var ss store.SessionSummary
		var created, updated int64
		if err := rows.Scan(&ss.SessionID, &created, &updated, &ss.Turns, &ss.Title); err != nil {
			return nil, err
		}
		ss.CreatedAt, ss.UpdatedAt, ss.Title = fromNanos(created), fromNanos(updated), store.ShortInput(ss.Title)
		out = append(out, ss)
	}
	return out, rows.Err()
}

// History implements store.Store.
func (s *Store) History(ctx context.Context, sessionID string) ([]model.Message, error) {
	if s.isClosed() {
		return nil, store.ErrClosed
	}
	msgs, err := s.messages(ctx, sessionID)
	if err != nil {
		return nil, err
	}
	var out []model.Message
	for _, m := range msgs {
		out = append(out, m.Message)
	}
	return out, nil
}
