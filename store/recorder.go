package store

import (
	"context"
	"fmt"
	"sync"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
)

// Recorder writes one turn to a Store as it runs: Begin before the turn,
// every event as it is emitted (Recorder is the turn's event.Sink), Finish
// with the turn's result. Events are queued (Store.QueueEvent), so the
// turn never waits for the disk, except for those that carry a call
// record, which it waits for, at most RecordWait (Enqueue): a crash loses
// at most the last few milliseconds of deltas and progress, and a record
// only when the store was already behind.
//
// A failed write does not stop the turn — a full disk must not turn a
// finished answer into a failure — so Emit keeps the first error for Err
// and the turn's later events are still attempted. Recorder is safe for
// concurrent use.
type Recorder struct {
	s Store

	mu     sync.Mutex
	err    error
	failed int
	// made good: the event writes that failed as the turn ran and that its
	// end stored (Finish), and the first one's error.
	madeGood    int
	madeGoodErr error
}

// NewRecorder returns a Recorder writing to s.
func NewRecorder(s Store) *Recorder { return &Recorder{s: s} }

// Begin records the turn as running (Store.BeginTurn).
func (r *Recorder) Begin(ctx context.Context, t TurnStart) error {
	if err := r.s.BeginTurn(ctx, t); err != nil {
		return fmt.Errorf("storing turn %s: %w", t.TurnID, err)
	}
	return nil
}

// Emit stores e. It is called by the turn's emitter, one event at a time.
func (r *Recorder) Emit(e event.Event) {
	failed := func(err error) {
		if err != nil {
			r.fail(fmt.Errorf("storing event %d (%s) of turn %s: %w", e.Seq, e.Type, e.TurnID, err))
		}
	}
	Enqueue(r.s, e, failed)
}

// ShareReply implements event.ReplySharer for a store that keeps events
// in memory (Memory).
func (r *Recorder) ShareReply(deltas []event.Event) { ShareReply(r.s, deltas) }

// ShareReply gives a joined reply's deltas to s when it keeps events in
// memory (an event.ReplySharer), for a sink that writes to s.
func ShareReply(s Store, deltas []event.Event) {
	if rs, ok := s.(event.ReplySharer); ok {
		rs.ShareReply(deltas)
	}
}

// Finish stores the turn's final record and its session messages
// (Store.FinishTurn, which stores the queued events first). It returns the
// first error of the whole turn: this one, or an earlier failed event
// write that the end did not make good.
//
// The end stores every event of rec.Events that the store lacks
// (EndOf). So once it is stored with the turn's log, the events whose
// writes failed as the turn ran (a disk that was full for a while) are
// stored: they are no longer an error, and MadeGood counts them.
func (r *Recorder) Finish(ctx context.Context, rec *event.Turn, msgs []model.Message) error {
	if err := r.s.FinishTurn(ctx, rec, msgs); err != nil {
		r.fail(fmt.Errorf("storing the record of turn %s: %w", rec.TurnID, err))
	} else if EndStoresLog(rec) {
		r.mu.Lock()
		if r.failed > 0 {
			r.madeGood, r.madeGoodErr = r.failed, r.err
			r.err, r.failed = nil, 0
		}
		r.mu.Unlock()
	}
	return r.Err()
}

// MadeGood returns how many event writes failed as the turn ran that its
// end then stored (Finish), and the first one's error; 0 and nil when
// none did.
func (r *Recorder) MadeGood() (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.madeGood, r.madeGoodErr
}

// Err returns the first write error, or nil.
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil && r.failed > 1 {
		return fmt.Errorf("%w (and %d more failed writes)", r.err, r.failed-1)
	}
	return r.err
}

func (r *Recorder) fail(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = err
	}
	r.failed++
}
