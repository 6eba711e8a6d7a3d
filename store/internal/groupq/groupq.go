// Package groupq is the group commit the durable stores share: events are
// queued as turns emit them and one writer goroutine commits whatever is
// waiting, in queue order, one transaction per group, then calls each
// event's callback in that order (docs/decisions/group-commit.md). A store
// may queue its own writes among the events (Do: a turn's end, after the
// turn's events), to share their transactions
// (docs/decisions/turn-ends-in-groups.md).
//
// A group whose commit fails for a reason that passes (the database is
// away, a lock is held: Options.Transient) is committed again, whole and
// in order, until it is stored: nothing queued is dropped while the
// database is away (docs/decisions/store-outages.md). The queue is bounded
// in events and in bytes; past either bound Add waits, so an outage costs
// bounded memory. A group that fails otherwise is committed one event at a
// time, so that one bad event fails only its own callback.
package groupq

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/internal/retry"
)

// Item is one queued event, or a store's own write (Work).
type Item struct {
	Event event.Event
	// Data is Event's JSON.
	Data []byte
	// Work, when not nil, is what Do queued in place of an event: the
	// store's Commit does it in the group's transaction, in its place.
	Work any
	// Err is set by a commit that stored the group but not this event (a
	// turn that is unknown, or that another process ended).
	Err error
	// Token is the commit's to set: it stays with the item while its
	// group is committed again, so that a commit whose answer was lost
	// (the connection cut as it committed) can find that it was stored.
	Token string

	committed func(error)
	flushed   chan struct{}
}

// Commit writes a group of events in one transaction. It returns an error
// when the transaction failed, leaving the items as they were given (a
// commit that numbers events numbers copies until it commits): the queue
// commits the group again, or each event alone.
type Commit func(group []*Item) error

// Options tune a Queue. Zero values take the defaults.
type Options struct {
	// MaxGroup bounds how many events share one transaction: 1024.
	MaxGroup int
	// MaxQueue and MaxBytes bound the events waiting, in number
	// (store.MaxQueued) and in bytes of JSON (64 MiB): past either, Add
	// waits for room.
	MaxQueue int
	MaxBytes int64
	// Encode returns an event's JSON as the store keeps it, on the
	// caller's goroutine. Nil: event.Marshal.
	Encode func(event.Event) ([]byte, error)
	// Transient reports whether a commit's error passes — the database is
	// away, a lock is held — so that the group is committed again rather
	// than failed. Nil: no error does.
	Transient func(error) bool
	// Backoff is the first wait before a group is committed again, doubled
	// up to MaxBackoff: retry's defaults, 100ms and 5s.
	Backoff, MaxBackoff time.Duration
	// Stuck is how long one commit may take before the queue is behind
	// even though nothing failed yet (a lock held on a table): 2s.
	Stuck time.Duration
	// CloseTimeout bounds how long Close goes on committing what is queued
	// while commits keep failing: 30s. What is left then fails.
	CloseTimeout time.Duration
	// OnState, when set, is called when the queue starts to fall behind (a
	// commit failed and will be tried again) and when it has caught up, on
	// the writer's goroutine: for a log line.
	OnState func(Status)
}

// Status is how the queue stands.
type Status struct {
	// Waiting and Bytes are the events queued or being committed.
	Waiting int
	Bytes   int64
	// FailingSince is when commits began to fail, zero while they do not;
	// Err is the last failure.
	FailingSince time.Time
	Err          error
	// Stuck is set when no commit failed but one has waited Stuck.
	Stuck bool
	// Recovered, in the Status OnState is given when commits work again,
	// is how long they failed.
	Recovered time.Duration
}

// Behind reports whether commits are failing.
func (s Status) Behind() bool { return !s.FailingSince.IsZero() }

// Queue is a group-commit queue with its writer goroutine. It is safe for
// concurrent use.
type Queue struct {
	commit Commit
	o      Options

	mu      sync.Mutex
	queue   []*Item
	bytes   int64 // of queue and the batch being written
	inBatch int   // events of the batch being written
	closed  bool
	closing time.Time // when Close was called
	failing time.Time
	lastErr error
	// committing is when the commit under way began, zero between them.
	committing time.Time
	room       *sync.Cond
	// group is the writer's: the events of the run it commits (write).
	group   []*Item
	wake    chan struct{} // the writer has work (capacity 1)
	written chan struct{} // closed when the writer has stopped
	stop    chan struct{} // Close: stop waiting between attempts
}

// New starts a queue whose writer commits with commit.
func New(commit Commit, o Options) *Queue {
	if o.MaxGroup <= 0 {
		o.MaxGroup = 1024
	}
	if o.MaxQueue <= 0 {
		o.MaxQueue = store.MaxQueued
	}
	if o.MaxBytes <= 0 {
		o.MaxBytes = 64 << 20
	}
	if o.Stuck <= 0 {
		o.Stuck = 2 * time.Second
	}
	if o.Encode == nil {
		o.Encode = event.Marshal
	}
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = 30 * time.Second
	}
	q := &Queue{commit: commit, o: o, wake: make(chan struct{}, 1), written: make(chan struct{}), stop: make(chan struct{})}
	q.room = sync.NewCond(&q.mu)
	go q.writer()
	return q
}

// Add queues e; committed, when not nil, is called once e is stored or
// with the error that kept it from being stored (store.ErrClosed after
// Close). It waits for room when the queue is full.
func (q *Queue) Add(e event.Event, committed func(error)) {
	data, err := q.o.Encode(e)
	if err == nil {
		err = q.enqueue(&Item{Event: e, Data: data, committed: committed})
	}
	if err != nil && committed != nil {
		committed(err)
	}
}

// Do queues work, a store's own write, behind the events queued before
// it: the store's Commit is handed it in its place in a group (Item.Work),
// and it is committed, retried and failed as an event is. committed, when
// not nil, is called once it is stored or with the error that kept it from
// being stored (store.ErrClosed after Close).
func (q *Queue) Do(work any, committed func(error)) {
	if err := q.enqueue(&Item{Work: work, committed: committed}); err != nil && committed != nil {
		committed(err)
	}
}

// Flush returns once every event queued before it is stored (or has
// failed) and its callback has returned.
func (q *Queue) Flush(ctx context.Context) error {
	it := &Item{flushed: make(chan struct{})}
	if err := q.enqueue(it); err != nil {
		return err
	}
	select {
	case <-it.flushed:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Status returns how the queue stands.
func (q *Queue) Status() Status {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.statusLocked()
}

func (q *Queue) statusLocked() Status {
	st := Status{Waiting: len(q.queue) + q.inBatch, Bytes: q.bytes, FailingSince: q.failing, Err: q.lastErr}
	if st.FailingSince.IsZero() && !q.committing.IsZero() {
		// A commit that neither ends nor fails — a lock held on a table,
		// a database that stopped answering — is behind as well.
		if waited := time.Since(q.committing); waited >= q.o.Stuck {
			st.FailingSince, st.Stuck = q.committing, true
			st.Err = fmt.Errorf("a commit has waited %s for the database (a lock held, or a database that does not answer)", waited.Round(time.Second))
		}
	}
	return st
}

// Close refuses new events and returns once the writer has committed
// everything queued before it — going on while commits fail for at most
// Options.CloseTimeout, after which what is left fails. It is idempotent.
func (q *Queue) Close() { q.CloseWithin(q.o.CloseTimeout) }

// CloseWithin is Close going on for at most d (what is left of a longer
// close's time), in place of Options.CloseTimeout.
func (q *Queue) CloseWithin(d time.Duration) {
	q.mu.Lock()
	if !q.closed {
		q.closed, q.closing = true, time.Now()
		time.AfterFunc(max(d, 0), func() { close(q.stop) })
	}
	q.room.Broadcast()
	q.mu.Unlock()
	q.poke()
	<-q.written
}

func (q *Queue) enqueue(it *Item) error {
	q.mu.Lock()
	for !q.closed && it.flushed == nil && (len(q.queue)+q.inBatch >= q.o.MaxQueue || q.bytes >= q.o.MaxBytes) {
		q.room.Wait()
	}
	if q.closed {
		q.mu.Unlock()
		return store.ErrClosed
	}
	q.queue = append(q.queue, it)
	q.bytes += int64(len(it.Data))
	q.mu.Unlock()
	q.poke()
	return nil
}

func (q *Queue) poke() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// writer commits the queue, all that is waiting at a time, until the queue
// is closed and empty. Nothing waits on purpose: a group is what arrived
// while the previous commit ran.
func (q *Queue) writer() {
	defer close(q.written)
	var batch []*Item
	for {
		q.mu.Lock()
		for len(q.queue) == 0 && !q.closed {
			q.mu.Unlock()
			<-q.wake
			q.mu.Lock()
		}
		if len(q.queue) == 0 {
			q.mu.Unlock()
			return
		}
		batch, q.queue = q.queue, batch[:0]
		q.inBatch = len(batch)
		q.mu.Unlock()
		q.write(batch)
		clear(batch) // let the events go
	}
}

// write commits a taken queue in order: runs of events up to MaxGroup per
// transaction, each followed by its callbacks. A Flush marker does not end
// a run: it is released once the run it is in is done, everything before
// it with it. (Ending the run there made 10,000 turns that end at once,
// each flushing before its end, commit one event at a time: issue 29.)
func (q *Queue) write(batch []*Item) {
	for len(batch) > 0 {
		n, group := 0, q.group[:0]
		for n < len(batch) && (len(group) < q.o.MaxGroup || batch[n].flushed != nil) {
			if batch[n].flushed == nil {
				group = append(group, batch[n])
			}
			n++
		}
		if len(group) > 0 {
			q.commitGroup(group)
		}
		for _, it := range batch[:n] {
			if it.flushed != nil {
				close(it.flushed)
			}
		}
		q.group = group
		clear(q.group)
		q.taken(batch[:n])
		batch = batch[n:]
	}
}

// taken frees the room of items that are done.
func (q *Queue) taken(done []*Item) {
	q.mu.Lock()
	for _, it := range done {
		q.bytes -= int64(len(it.Data))
	}
	q.inBatch -= len(done)
	q.room.Broadcast()
	q.mu.Unlock()
}

// commitGroup commits group until it is stored, or has failed for good.
// A transient failure commits it again, whole, after a backoff; another
// failure commits each event alone, so that one bad event fails only its
// own callback (each of those retried as the group is, while the failure
// passes).
func (q *Queue) commitGroup(group []*Item) {
	err := q.attempt(group)
	if err == nil {
		for _, it := range group {
			it.done(it.Err)
		}
		return
	}
	if len(group) == 1 {
		group[0].done(err)
		return
	}
	for _, it := range group {
		it.Err = nil
		err := q.attempt([]*Item{it})
		if err == nil {
			err = it.Err
		}
		it.done(err)
	}
}

// attempt commits group, again while the failure is transient, until it
// is stored, fails otherwise, or Close's time ran out.
func (q *Queue) attempt(group []*Item) error {
	err := retry.Do(context.Background(), retry.Policy{Transient: q.o.Transient, Backoff: q.o.Backoff, MaxBackoff: q.o.MaxBackoff,
		Stop: q.stop, Failing: func(err error, _ time.Time) { q.state(err) },
		Stopped: func(err error) error {
			return fmt.Errorf("%w: the store was closed while it could not store events: %w", store.ErrClosed, err)
		}}, func() error {
		for _, it := range group {
			it.Err = nil
		}
		q.mu.Lock()
		q.committing = time.Now()
		q.mu.Unlock()
		defer func() {
			q.mu.Lock()
			q.committing = time.Time{}
			q.mu.Unlock()
		}()
		return q.commit(group)
	})
	if err == nil || q.o.Transient == nil || !q.o.Transient(err) {
		q.state(nil)
	}
	return err
}

// state notes that commits fail (err) or work again (nil), and tells
// OnState when that changes.
func (q *Queue) state(err error) {
	q.mu.Lock()
	since := q.failing
	if err != nil {
		if since.IsZero() {
			q.failing = time.Now()
		}
		q.lastErr = err
	} else {
		q.failing, q.lastErr = time.Time{}, nil
	}
	st := q.statusLocked()
	q.mu.Unlock()
	if since.IsZero() == (err == nil) || q.o.OnState == nil {
		return
	}
	if err == nil {
		st.Recovered = time.Since(since)
	}
	q.o.OnState(st)
}

func (it *Item) done(err error) {
	if it.committed != nil {
		it.committed(err)
	}
}

// Backlog returns the queue's status as a store.Backlog.
func (q *Queue) Backlog() store.Backlog {
	st := q.Status()
	b := store.Backlog{Events: st.Waiting, Bytes: st.Bytes, Since: st.FailingSince}
	switch {
	case st.Stuck:
		b.Err = st.Err.Error()
	case st.Err != nil:
		// The store's own error names its database, host and user:
		// /healthz answers anyone, so it says only what is wrong. The
		// log has the error (Log).
		b.Err = "writes to the store fail; they are kept and tried again (the server's log has the error)"
	}
	return b
}

// Log returns an OnState that logs, to log, when the store at where falls
// behind and when it has caught up. A nil log discards them.
func Log(log *slog.Logger, where string) func(Status) {
	if log == nil {
		return nil
	}
	return func(st Status) {
		if st.Behind() {
			log.Warn(where+": cannot store events; keeping them and trying again", "waiting", st.Waiting, "bytes", st.Bytes, "err", st.Err)
			return
		}
		log.Info(where+": caught up", "after", st.Recovered.Round(time.Millisecond), "waiting", st.Waiting)
	}
}
