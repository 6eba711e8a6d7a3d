package store

import "time"

// Backlog is what a store has not stored yet: the events it keeps and
// commits again while its database is away or locked.
type Backlog struct {
	// Events and Bytes are the events waiting (with SQLite, the turns'
	// ends queued among them count as events:
	// docs/decisions/turn-ends-in-groups.md).
	Events int   `json:"events"`
	Bytes  int64 `json:"bytes"`
	// Since is when writes began to fail; zero while they do not. Err
	// says what is wrong, for anyone (/healthz): not the store's own
	// error, which may name its database, host and user.
	Since time.Time `json:"since,omitzero"`
	Err   string    `json:"error,omitempty"`
}

// Behind reports whether writes are failing.
func (b Backlog) Behind() bool { return !b.Since.IsZero() }

// Backlogged is a store that keeps events while it cannot write them
// (SQLite, PostgreSQL): /healthz says how far behind it is.
type Backlogged interface {
	Backlog() Backlog
}
