package store

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Deliveries is a store that keeps the queue of webhook deliveries of
// `timebox serve` (docs/webhooks.md): each event a receiver subscribes to
// is one delivery, stored before it is sent, so that a restart loses none;
// it is leased to one gateway at a time, so that of several gateways
// sharing the database one sends it; and its attempts are kept. SQLite,
// PostgreSQL and Memory implement it.
type Deliveries interface {
	// EnqueueDeliveries stores ds, pending and due at their NextAttemptAt,
	// in one transaction. A delivery whose ID is stored already is left as
	// it is: enqueueing again is a no-op.
	EnqueueDeliveries(ctx context.Context, ds []Delivery) error
	// ClaimDeliveries leases to owner, until now+lease, up to limit pending
	// deliveries due at now (NextAttemptAt not after it) that nobody holds
	// a lease on (none, or one that ran out), soonest due first, and
	// returns them with their bodies. Of several callers sharing the
	// database, each delivery is claimed by one until its lease runs out.
	ClaimDeliveries(ctx context.Context, owner string, now time.Time, lease time.Duration, limit int) ([]Delivery, error)
	// RecordAttempt adds attempt a to delivery id, which owner holds the
	// lease on, sets its state and, while it is pending, when it is due
	// again (next), and ends the lease. It returns ErrLeaseLost (wrapped)
	// when owner no longer holds the lease (it ran out and another took
	// it), and ErrNotFound for an unknown delivery.
	RecordAttempt(ctx context.Context, id, owner string, a DeliveryAttempt, state DeliveryState, next time.Time) error
	// ListDeliveries lists deliveries, newest first, without their bodies.
	ListDeliveries(ctx context.Context, f DeliveryFilter) ([]Delivery, error)
	// PruneDeliveries deletes the deliveries that are no longer pending
	// (delivered or failed) and were created before before, and returns
	// how many it deleted. Pending ones are never deleted.
	PruneDeliveries(ctx context.Context, before time.Time) (int, error)
}

// ErrLeaseLost is returned (wrapped) by RecordAttempt when the caller's
// lease on a delivery ran out and another claimed it.
var ErrLeaseLost = errors.New("the lease on the delivery was lost")

// AttemptRecorded reports whether attempts hold a: the same gateway's
// attempt at the same time. A store whose RecordAttempt is tried again
// after a commit whose answer was lost (the connection cut as the
// database committed) finds the lease ended by that commit, and a among
// the attempts: it was recorded, not lost to another gateway.
func AttemptRecorded(attempts []DeliveryAttempt, a DeliveryAttempt) bool {
	return slices.ContainsFunc(attempts, func(x DeliveryAttempt) bool { return x.By == a.By && x.At.Equal(a.At) })
}

// DeliveryState is where a delivery stands.
type DeliveryState string

// The states of a delivery.
const (
	// DeliveryPending is waiting for its next attempt (or in one).
	DeliveryPending DeliveryState = "pending"
	// DeliveryDelivered was answered 2xx.
	DeliveryDelivered DeliveryState = "delivered"
	// DeliveryFailed was given up: out of attempts or too old.
	DeliveryFailed DeliveryState = "failed"
)

// Delivery is one event to POST to one webhook receiver.
type Delivery struct {
	// ID is the message id (webhook-id): the same on every attempt.
	ID string `json:"id"`
	// URL is the receiver's, from server.webhooks.
	URL string `json:"url"`
	// EventType (event_type) is the type of the event delivered
	// (turn_finished, …).
	EventType string `json:"event_type"`
	// TurnID (turn_id) and Seq are the event's turn and seq.
	TurnID string `json:"turn_id,omitempty"`
	Seq    int64  `json:"seq,omitempty"`
	// Body is what is POSTed: the event's JSON. Listings leave it out.
	Body []byte `json:"-"`
	// CreatedAt (created_at) is when the delivery was stored.
	CreatedAt time.Time `json:"created_at"`
	// State is pending, delivered or failed.
	State DeliveryState `json:"state"`
	// NextAttemptAt is when a pending delivery is due.
	NextAttemptAt time.Time `json:"next_attempt_at,omitzero"`
	// Attempts are the attempts so far, oldest first.
	Attempts []DeliveryAttempt `json:"attempts"`
}

// DeliveryAttempt is one POST of a delivery.
type DeliveryAttempt struct {
	// At is when the attempt began.
	At time.Time `json:"at"`
	// Status is the receiver's HTTP status; 0 when it gave none (it could
	// not be reached, or did not answer in time: Error says which).
	Status int `json:"status"`
	// DurationMS (duration_ms) is how long the attempt took, in
	// milliseconds.
	DurationMS int64 `json:"duration_ms"`
	// Error says how the attempt failed (no answer, a status not 2xx,
	// given up); empty (omitted) when it did not.
	Error string `json:"error,omitempty"`
	// By names the gateway (its store's owner) that made the attempt.
	By string `json:"by,omitempty"`
	// NextRetryAt is when the delivery is tried again after this attempt;
	// zero when it is not (delivered, or given up).
	NextRetryAt time.Time `json:"next_retry_at,omitzero"`
}

// DeliveryFilter selects deliveries for ListDeliveries. The zero filter
// lists the DefaultLimit newest.
type DeliveryFilter struct {
	// State and TurnID keep only the deliveries that match; empty matches
	// any.
	State  DeliveryState
	TurnID string
	// Limit is as Filter's.
	Limit int
}

// Keep reports whether d passes f (the limit aside).
func (f DeliveryFilter) Keep(d Delivery) bool {
	return (f.State == "" || d.State == f.State) && (f.TurnID == "" || d.TurnID == f.TurnID)
}

var _ Deliveries = (*Memory)(nil)

type memDelivery struct {
	d          Delivery
	n          int // order of enqueueing
	leaseOwner string
	leaseUntil time.Time
}

// EnqueueDeliveries implements Deliveries.
func (m *Memory) EnqueueDeliveries(_ context.Context, ds []Delivery) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return err
	}
	if m.deliveries == nil {
		m.deliveries = map[string]*memDelivery{}
	}
	for _, d := range ds {
		if _, ok := m.deliveries[d.ID]; ok {
			continue
		}
		d.State = DeliveryPending
		d.Body = slices.Clone(d.Body)
		d.Attempts = nil
		m.deliveries[d.ID] = &memDelivery{d: d, n: len(m.deliveries)}
	}
	return nil
}

// ClaimDeliveries implements Deliveries.
func (m *Memory) ClaimDeliveries(_ context.Context, owner string, now time.Time, lease time.Duration, limit int) ([]Delivery, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	var due []*memDelivery
	for _, md := range m.deliveries {
		if md.d.State == DeliveryPending && !md.d.NextAttemptAt.After(now) && !md.leaseUntil.After(now) {
			due = append(due, md)
		}
	}
	slices.SortFunc(due, func(a, b *memDelivery) int {
		return cmp.Or(a.d.NextAttemptAt.Compare(b.d.NextAttemptAt), cmp.Compare(a.n, b.n))
	})
	if len(due) > limit {
		due = due[:limit]
	}
	out := make([]Delivery, 0, len(due))
	for _, md := range due {
		md.leaseOwner, md.leaseUntil = owner, now.Add(lease)
		d := md.d
		d.Body = slices.Clone(d.Body)
		d.Attempts = slices.Clone(d.Attempts)
		out = append(out, d)
	}
	return out, nil
}

// RecordAttempt implements Deliveries.
func (m *Memory) RecordAttempt(_ context.Context, id, owner string, a DeliveryAttempt, state DeliveryState, next time.Time) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return err
	}
	md := m.deliveries[id]
	switch {
	case md == nil:
		return fmt.Errorf("delivery %s: %w", id, ErrNotFound)
	case md.leaseOwner != owner:
		return fmt.Errorf("delivery %s: %w", id, ErrLeaseLost)
	}
	md.d.Attempts = append(md.d.Attempts, a)
	md.d.State = state
	md.d.NextAttemptAt = time.Time{}
	if state == DeliveryPending {
		md.d.NextAttemptAt = next
	}
	md.leaseOwner, md.leaseUntil = "", time.Time{}
	return nil
}

// ListDeliveries implements Deliveries.
func (m *Memory) ListDeliveries(_ context.Context, f DeliveryFilter) ([]Delivery, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return nil, err
	}
	var all []*memDelivery
	for _, md := range m.deliveries {
		if f.Keep(md.d) {
			all = append(all, md)
		}
	}
	slices.SortFunc(all, func(a, b *memDelivery) int { return cmp.Compare(b.n, a.n) })
	out := []Delivery{}
	for _, md := range all[:min(len(all), ClampLimit(f.Limit))] {
		d := md.d
		d.Body = nil
		d.Attempts = slices.Clone(d.Attempts)
		out = append(out, d)
	}
	return out, nil
}

// PruneDeliveries implements Deliveries.
func (m *Memory) PruneDeliveries(_ context.Context, before time.Time) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.check(); err != nil {
		return 0, err
	}
	n := 0
	for id, md := range m.deliveries {
		if md.d.State != DeliveryPending && md.d.CreatedAt.Before(before) {
			delete(m.deliveries, id)
			n++
		}
	}
	return n, nil
}
