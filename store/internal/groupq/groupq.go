// Package groupq is the group commit the durable stores share: events are
// queued as turns emit them and one writer goroutine commits whatever is
// waiting, in queue order, one transaction per group, then calls each
// event's callback in that order (docs/decisions/group-commit.md).
package groupq

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
)

// Item is one queued event.
type Item struct {
	Event event.Event
	// Data is Event's JSON.
	Data []byte
	// Err is set by a commit that stored the group but not this event (a
	// turn that is unknown, or that another process ended).
	Err error

	committed func(error)
	flushed   chan struct{}
}

// Commit writes a group of events in one transaction. It returns an error
// when the transaction failed; then the queue commits each event of the
// group alone, so that one bad event fails only its own callback.
type Commit func(group []*Item) error

// Queue is a group-commit queue with its writer goroutine. It is safe for
// concurrent use.
type Queue struct {
	commit   Commit
	maxGroup int
	maxQueue int

	mu      sync.Mutex
	queue   []*Item
	closed  bool
	room    *sync.Cond
	wake    chan struct{} // the writer has work (capacity 1)
	written chan struct{} // closed when the writer has stopped
}

// New starts a queue whose writer commits up to maxGroup events per
// transaction; Add waits while maxQueue events are waiting.
func New(commit Commit, maxGroup, maxQueue int) *Queue {
	q := &Queue{commit: commit, maxGroup: maxGroup, maxQueue: maxQueue,
		wake: make(chan struct{}, 1), written: make(chan struct{})}
	q.room = sync.NewCond(&q.mu)
	go q.writer()
	return q
}

// Add queues e; committed, when not nil, is called once e is stored or
// with the error that kept it from being stored (store.ErrClosed after
// Close). It waits for room when the queue is full.
func (q *Queue) Add(e event.Event, committed func(error)) {
	data, err := json.Marshal(e)
	if err == nil {
		err = q.enqueue(&Item{Event: e, Data: data, committed: committed})
	}
	if err != nil && committed != nil {
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

// Close refuses new events and returns once the writer has committed
// everything queued before it. It is idempotent.
func (q *Queue) Close() {
	q.mu.Lock()
	q.closed = true
	q.room.Broadcast()
	q.mu.Unlock()
	q.poke()
	<-q.written
}

func (q *Queue) enqueue(it *Item) error {
	q.mu.Lock()
	for !q.closed && len(q.queue) >= q.maxQueue && it.flushed == nil {
		q.room.Wait()
	}
	if q.closed {
		q.mu.Unlock()
		return store.ErrClosed
	}
	q.queue = append(q.queue, it)
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
		q.room.Broadcast()
		q.mu.Unlock()
		q.write(batch)
		clear(batch) // let the events go
	}
}

// write commits a taken queue in order: runs of events up to maxGroup per
// transaction, each followed by its callbacks; a Flush marker is released
// once everything before it is done.
func (q *Queue) write(batch []*Item) {
	for len(batch) > 0 {
		if batch[0].flushed != nil {
			close(batch[0].flushed)
			batch = batch[1:]
			continue
		}
		n := 1
		for n < len(batch) && n < q.maxGroup && batch[n].flushed == nil {
			n++
		}
		q.commitGroup(batch[:n])
		batch = batch[n:]
	}
}

func (q *Queue) commitGroup(group []*Item) {
	if len(group) > 1 {
		if err := q.commit(group); err == nil {
			for _, it := range group {
				it.done(it.Err)
			}
			return
		}
		for _, it := range group {
			it.Err = nil
		}
	}
	for _, it := range group {
		err := q.commit([]*Item{it})
		if err == nil {
			err = it.Err
		}
		it.done(err)
	}
}

func (it *Item) done(err error) {
	if it.committed != nil {
		it.committed(err)
	}
}
