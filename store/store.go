// Package store keeps what turns leave behind — sessions, turns, their
// events and their call records, and each session's conversation — durably
// (spec §13), behind an interface small enough that the embedded SQLite
// store (store/sqlite) can give way to a server database when several
// gateways share one history.
//
// Events are queued as they are emitted (Recorder) and written in batches,
// so a crash loses at most the last few milliseconds of what a turn said,
// never a call record (docs/decisions/group-commit.md); a turn that a
// crash left running is marked interrupted by the next process that opens
// the store. Memory is an in-memory Store for tests and for programs that
// keep nothing.
package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
)

// ErrNotFound is returned (wrapped) for a turn or session the store does
// not hold. Test with errors.Is.
var ErrNotFound = errors.New("not found")

// ErrExists is returned (wrapped) by BeginTurn for a turn id already used.
var ErrExists = errors.New("already exists")

// ErrClosed is returned (wrapped) by every method of a closed store.
var ErrClosed = errors.New("store is closed")

// ErrSessionBusy is returned (wrapped) by BeginTurn for a turn of a session
// that has another turn running: two turns built on the same history would
// each miss the other's messages.
var ErrSessionBusy = errors.New("session has a turn running")

// ErrUnavailable is returned (wrapped) by BeginTurn when the store cannot
// be written for now — the database is away, another process holds the
// file's lock — and by a read when its database cannot be reached for now
// (PostgreSQL), so that the request can be made again later or elsewhere
// (HTTP 503 store_unavailable) rather than taken for a failure.
var ErrUnavailable = errors.New("the store cannot be reached for now")

// ErrNotRunning is returned (wrapped) by RequestCancel for a turn that has
// already ended.
var ErrNotRunning = errors.New("turn is not running")

// ErrNotHere is returned (wrapped) by RequestCancel for a turn that runs in
// another process this store cannot reach: SQLite and Memory carry cancel
// requests only within their own process; PostgreSQL carries them to every
// gateway sharing the database.
var ErrNotHere = errors.New("turn runs in another process")

// Store holds sessions, turns, events and records. Implementations are safe
// for concurrent use; every write but QueueEvent is durable when the method
// returns (a process crash right after loses nothing).
type Store interface {
	// BeginTurn records a new turn as running, owned by this store, and its
	// session if the session is new. It returns ErrExists for a turn id
	// already stored, and ErrSessionBusy when the session has a turn
	// running (begun by this store or by another sharing the database).
	BeginTurn(ctx context.Context, t TurnStart) error
	// AppendEvent stores one event of a running turn, in seq order, and
	// returns once it is durable: it is QueueEvent waiting for its batch.
	// The records that tool_finished and llm_finished carry are stored with
	// it, so a crashed turn keeps its call records. Appending a seq already
	// stored is a no-op. A seq of 0 asks the store to number the event:
	// the turn's next seq, in the order events are committed — for an
	// engine whose units of work emit a turn's events from several
	// processes at once (package temporal). PostgreSQL and Memory number
	// events; SQLite refuses seq 0.
	AppendEvent(ctx context.Context, e event.Event) error
	// QueueEvent queues one event of a running turn to be stored as
	// AppendEvent stores it, and returns without waiting for the disk:
	// queued events are written in batches, one transaction each, in the
	// order they were queued (group commit). committed, when not nil, is
	// called once e is durable, or with the error that kept it from being
	// stored — in queue order, on the store's writer, so it must be quick
	// and must not call the store's write methods or Flush. A crash loses
	// what is still queued; Flush, FinishTurn and Close store it first.
	// When the store cannot keep up, QueueEvent waits for room in a
	// bounded queue rather than grow without end.
	QueueEvent(e event.Event, committed func(error))
	// Flush returns once every event queued before it is stored (or has
	// failed) and its committed callback has returned.
	Flush(ctx context.Context) error
	// FinishTurn stores a turn's final record and the messages it added to
	// its session's conversation. Events queued before it are stored first
	// (before it, or in its transaction), then the events of rec.Events not
	// yet stored, and the call records of rec that its stored events did
	// not carry as they are (EndOf): a record passed with neither events
	// nor model calls leaves the stored model calls as they are. A tool
	// call record already updated by UpdateToolCall with a late result
	// keeps it. A turn that BeginTurn never saw is created.
	FinishTurn(ctx context.Context, rec *event.Turn, msgs []model.Message) error
	// UpdateToolCall replaces one tool call record, for a late result
	// (event.LateSink) that came back after its turn ended. It
	// returns ErrNotFound if the turn is unknown.
	UpdateToolCall(ctx context.Context, rec event.ToolCall) error

	// Turn returns a turn's record with its tool and model call records,
	// without its events (see Events). A running turn has status running
	// and the records of the calls that ended so far.
	Turn(ctx context.Context, id string) (*event.Turn, error)
	// Turns lists turns newest first.
	Turns(ctx context.Context, f Filter) ([]TurnSummary, error)
	// Events returns up to limit events of a turn with seq > after, in seq
	// order; limit <= 0 means all. An unknown turn is ErrNotFound.
	Events(ctx context.Context, turnID string, after int64, limit int) ([]event.Event, error)
	// Session returns a session: its turns oldest first and its
	// conversation.
	Session(ctx context.Context, id string) (*Session, error)
	// Sessions lists sessions, most recently active first; limit as in
	// Filter.
	Sessions(ctx context.Context, limit int) ([]SessionSummary, error)
	// History returns a session's conversation, to be given to the model
	// as agent.Input.History. An unknown session has an empty history.
	History(ctx context.Context, sessionID string) ([]model.Message, error)

	// Watch returns a channel that receives a signal whenever turn id may
	// have stored new events or ended — written by this store or by
	// another process sharing the database — and a function that ends the
	// watch (idempotent). Signals are coalesced (the channel holds one) and
	// say only "read again": a watcher re-reads the store after each. A
	// change is signalled at once when this store made it and, when
	// another process did, within the store's poll interval at worst
	// (SQLite: 250ms; PostgreSQL: at once by LISTEN/NOTIFY, 1s when a
	// notification was missed). Watching an unknown turn is not an error.
	Watch(turnID string) (<-chan struct{}, func())
	// RequestCancel asks whoever runs turn id to cancel it and returns
	// once the request is stored, not once the turn has ended (Watch it).
	// It returns ErrNotFound for an unknown turn, ErrNotRunning for one
	// that ended, and ErrNotHere when the turn runs in a process the store
	// cannot reach.
	RequestCancel(ctx context.Context, turnID string) error
	// WatchCancel returns a channel that receives a signal when a cancel
	// request for turn id — a turn this store began — is made, through
	// this store or another sharing the database, and a function that ends
	// the watch. A shared store also signals it when another process has
	// ended the turn (marked it interrupted, taking this one for dead):
	// nothing this one does for it can be stored any more. Register before
	// BeginTurn so that no request is missed.
	WatchCancel(turnID string) (<-chan struct{}, func())

	// Close releases the store. Queued events are stored, then turns it
	// began and never finished are marked interrupted: nothing can record
	// their end any more. Close is idempotent.
	Close() error
}

// Owned is a store that other processes sharing its database can take for
// gone (PostgreSQL): Owner names it, for TurnStart.Caller and
// TurnStart.Follower.
type Owned interface {
	Owner() string
}

// Followers is a store that knows which process follows each running turn
// an engine runs (TurnStart.Follower), and lets a live one take over the
// turns whose follower is gone (PostgreSQL). A follower is gone once its
// store is: closed, or taken for gone by the store sharing the database
// that notices it (the rule of Owned's turns and callers).
type Followers interface {
	// AdoptTurns makes this store's process the follower of at most limit
	// running turns of engine, begun for agent, whose follower is gone,
	// and returns their ids. Of stores adopting at once each turn goes to
	// one; the claim passes on when its holder is gone in turn. A store
	// that does not see the database now, or whose own heartbeat is
	// stale, adopts none.
	AdoptTurns(ctx context.Context, engine, agent string, limit int) ([]string, error)
	// Follower returns the follower of turn turnID (TurnStart.Follower,
	// or who adopted it since), empty when it has none, and ErrNotFound
	// for a turn not stored. A process that follows a turn whose follower
	// is another store's was taken for gone and its turn adopted: it stops
	// following it.
	Follower(ctx context.Context, turnID string) (string, error)
}

// CancelReasons is a store that keeps why a cancel was requested
// (PostgreSQL): a client's request, or the judgment that the process
// following a turn for its client is gone (client_gone).
type CancelReasons interface {
	// CancelReason returns why turn id's cancel was requested; nil, nil
	// when none is pending.
	CancelReason(ctx context.Context, turnID string) (*budget.CancelError, error)
}

// EngineCancels is a store that tells an engine's workers of the cancel
// requests of the turns the engine runs, so that they pass them on to the
// turns' workflows: a request stored by a process with no hold on the
// workflow (a gateway that found the turn's caller gone) reaches a turn
// that runs no unit to watch for it — one waiting for a person.
// PostgreSQL implements it.
type EngineCancels interface {
	// EngineCancels returns the running engine turns with a pending
	// cancel request.
	EngineCancels(ctx context.Context) ([]string, error)
	// WatchCancels returns a channel signalled when any cancel request is
	// stored (a hint: look again), and the function that stops it.
	WatchCancels() (<-chan struct{}, func())
}

// FilterStatuses and FilterStopReasons are what a Filter's Status and
// StopReason can be: the API's and the CLI's one list.
var (
	FilterStatuses = []budget.Status{budget.StatusRunning, budget.StatusCompleted, budget.StatusStopped, budget.StatusFailed,
		budget.StatusCancelled, budget.StatusInterrupted}
	FilterStopReasons = []budget.StopReason{budget.Answered, budget.TurnTimeout, budget.NoProgress, budget.LLMBudgetExhausted,
		budget.MaxSteps, budget.MaxToolCalls, budget.ModelUnresponsive, budget.ReplyTooLong, budget.ModelUnavailable, budget.ModelRejected,
		budget.CompactionFailed, budget.Cancelled, budget.ClientGone, budget.Shutdown, budget.Interrupted, budget.AgentMismatch, budget.EngineLost}
)

// Check refuses a status or stop reason no turn can have (a misspelt
// filter would match nothing, silently): it names the field, as
// statusField and reasonField call them, and the values there are.
func (f Filter) Check(statusField, reasonField string) error {
	if f.Status != "" && !slices.Contains(FilterStatuses, f.Status) {
		return fmt.Errorf("%s must be one of %s", statusField, joinStrings(FilterStatuses))
	}
	if f.StopReason != "" && !slices.Contains(FilterStopReasons, f.StopReason) {
		return fmt.Errorf("%s must be one of %s", reasonField, joinStrings(FilterStopReasons))
	}
	return nil
}

func joinStrings[T ~string](vs []T) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = string(v)
	}
	return strings.Join(s, ", ")
}

// TurnStart is what is known of a turn when it begins.
type TurnStart struct {
	// TurnID names the turn; BeginTurn refuses one already stored
	// (ErrExists).
	TurnID string
	// Engine, when set, names the engine whose workers run the turn
	// ("temporal"): no process of timebox owns it, so none is taken for
	// gone when a process stops, and only its engine ends it. It names
	// where on the engine the turn runs too ("temporal/billing": task
	// queue billing), for Followers. Empty: the process that begins the
	// turn runs it.
	Engine string
	// Caller, for a turn an engine runs, names the store (its Owner, see
	// store.Owned) of the process that follows the turn for its client:
	// when that process is gone — taken for gone by the store sharing the
	// database that notices it — the turn is cancelled with stop reason
	// client_gone, as when its client goes away. Empty: the turn outlives
	// whoever started it (a detached turn).
	Caller string
	// Follower, for a turn an engine runs, names the store (its Owner) of
	// the process that follows the turn — the gateway or `run` that
	// started it, detached or not — which notes its waits for a worker
	// and ends it when no worker can: when that process is gone, a live
	// gateway adopts the turn (Followers). Empty: no one follows it.
	Follower string
	// SessionID is the conversation the turn belongs to; empty for a turn
	// outside any session.
	SessionID string
	// Agent is the agent's name; empty when it has none.
	Agent string
	// Input is the user's message.
	Input string
	// StartedAt is when the turn began.
	StartedAt time.Time
}

// Filter selects turns for Turns. The zero Filter lists the DefaultLimit
// newest turns.
type Filter struct {
	// Status, StopReason and SessionID keep only the turns that match;
	// empty matches any (Check refuses a status or stop reason there is
	// none of).
	Status     budget.Status
	StopReason budget.StopReason
	SessionID  string
	// Before, a turn id, keeps only the turns that began before it: pass
	// the last id of a page to get the next one.
	Before string
	// Limit is the largest number of turns returned: 0 is DefaultLimit,
	// and anything above MaxLimit is MaxLimit.
	Limit int
}

// Limits of a listing.
const (
	DefaultLimit = 50
	MaxLimit     = 1000
)

// ClampLimit returns the number of rows a listing asked for n returns.
func ClampLimit(n int) int {
	switch {
	case n <= 0:
		return DefaultLimit
	case n > MaxLimit:
		return MaxLimit
	}
	return n
}

// TurnSummary is one turn in a listing.
type TurnSummary struct {
	// TurnID (turn_id) names the turn, and SessionID (session_id) its
	// conversation: empty (omitted) for a turn outside one.
	TurnID    string `json:"turn_id"`
	SessionID string `json:"session_id,omitempty"`
	// Agent is the agent's name; empty (omitted) when it has none.
	Agent string `json:"agent,omitempty"`
	// Input is the user's message, cut to SummaryInputRunes runes.
	Input string `json:"input"`
	// Status is the turn's status, running until it ends; StopReason
	// (stop_reason) says why it ended, empty (omitted) while it runs.
	Status     budget.Status     `json:"status"`
	StopReason budget.StopReason `json:"stop_reason,omitempty"`
	// Message is the turn's closing message; empty while it runs.
	Message string `json:"message,omitempty"`
	// StartedAt (started_at) is when the turn began; EndedAt (ended_at)
	// when it ended, nil (omitted) while it runs.
	StartedAt time.Time  `json:"started_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	// WallMS (wall_ms) is the turn's wall clock in milliseconds, once it
	// has ended.
	WallMS int64 `json:"wall_ms"`
	// Steps counts the model calls made so far.
	Steps int `json:"steps"`
	// ToolCalls (tool_calls) counts the turn's tool call records so far,
	// refused calls included (unlike event.Totals.ToolCalls).
	ToolCalls int `json:"tool_calls"`
	// Events is the seq of the turn's last stored event.
	Events int64 `json:"events"`
}

// SummaryInputRunes is how much of a turn's input a TurnSummary carries.
const SummaryInputRunes = 280

// ShortInput cuts s to SummaryInputRunes runes, marking the cut with "…".
// Implementations use it for TurnSummary.Input and SessionSummary.Title.
func ShortInput(s string) string {
	if utf8.RuneCountInString(s) <= SummaryInputRunes {
		return s
	}
	r := []rune(s)
	return string(r[:SummaryInputRunes-1]) + "…"
}

// Session is one conversation.
type Session struct {
	// SessionID (session_id) names the session.
	SessionID string `json:"session_id"`
	// CreatedAt (created_at) is when its first turn began, and UpdatedAt
	// (updated_at) when a turn of it last began or ended.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Turns are the session's turns, oldest first.
	Turns []TurnSummary `json:"turns"`
	// Messages are the conversation the model is given on the session's
	// next turn: the messages every ended turn added, in order.
	Messages []Message `json:"messages"`
}

// Message is one message of a session's conversation with the turn that
// added it.
type Message struct {
	// TurnID (turn_id) is the turn that added the message.
	TurnID string `json:"turn_id"`
	model.Message
}

// SessionSummary is one session in a listing.
type SessionSummary struct {
	// SessionID (session_id) names the session.
	SessionID string `json:"session_id"`
	// CreatedAt (created_at) is when its first turn began, and UpdatedAt
	// (updated_at) when a turn of it last began or ended.
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Turns counts the session's turns.
	Turns int `json:"turns"`
	// Title is the first turn's input, cut like TurnSummary.Input.
	Title string `json:"title"`
}

// CallRecords returns the call record an event carries: tool_finished
// carries a tool call's, llm_finished a model call's. Other events carry
// none. Store implementations use it in AppendEvent.
func CallRecords(e event.Event) (*event.ToolCall, *event.ModelCall) {
	tc, mc := carried(e)
	switch {
	case tc != nil:
		c := *tc
		c.TurnID = e.TurnID
		return &c, nil
	case mc != nil:
		c := *mc
		return nil, &c
	}
	return nil, nil
}

// carried returns the call record e carries, as e holds it (CallRecords
// returns a copy).
func carried(e event.Event) (*event.ToolCall, *event.ModelCall) {
	switch d := e.Data.(type) {
	case *event.ToolFinished:
		return &d.ToolCall, nil
	case *event.LLMFinished:
		return nil, &d.ModelCall
	case *event.CompactionFinished:
		return nil, d.Record
	}
	return nil, nil
}

// WaitForStore reports whether a sink should wait for e to be durable
// (AppendEvent) before the turn goes on, rather than queue it
// (QueueEvent): the events that carry a call record, so that a crash never
// loses the record of a call the turn has moved past. The rest — stream
// deltas, progress, notices — may be lost for the last few milliseconds
// before a crash.
func WaitForStore(e event.Event) bool {
	tc, mc := CallRecords(e)
	return tc != nil || mc != nil
}

// SameEnd reports whether events a and b end the same thing of a turn: the
// same tool call (tool_finished of one call_id), the same model call
// attempt (llm_finished of one step and attempt), the same compaction
// (compaction_finished whose records are of one step and attempt), or
// the turn itself (turn_finished). Among the events a store numbers (seq
// 0), whose units run on several machines, a second such end is refused
// with ErrExists: a unit whose worker was taken for lost, and recorded
// so, may still finish, and a call has exactly one record.
func SameEnd(a, b event.Event) bool {
	if a.Type != b.Type {
		return false
	}
	switch d := b.Data.(type) {
	case *event.ToolFinished:
		return a.Data.(*event.ToolFinished).CallID == d.CallID
	case *event.LLMFinished, *event.CompactionFinished:
		// A compaction_finished without a record (written by versions
		// before the records) names no attempt: it is never taken for
		// another's.
		_, x := carried(a)
		_, y := carried(b)
		return x != nil && y != nil && SameModelCall(*x, *y)
	case *event.TurnFinished:
		return true
	}
	return false
}

// SameModelCall reports whether a and b are records of the same model
// call attempt: one step, one attempt, both compactions or neither. A
// store that looks for an end among its stored records (SameEnd) compares
// them by it.
func SameModelCall(a, b event.ModelCall) bool {
	return a.Step == b.Step && a.Attempt == b.Attempt && a.Compaction == b.Compaction
}

// endOf names what e ends, for messages.
func endOf(e event.Event) string {
	switch d := e.Data.(type) {
	case *event.ToolFinished:
		return "call " + d.CallID
	case *event.LLMFinished:
		return fmt.Sprintf("step %d attempt %d", d.Step, d.Attempt)
	case *event.CompactionFinished:
		if d.Record != nil {
			return fmt.Sprintf("the compaction of step %d attempt %d", d.Step, d.Record.Attempt)
		}
	}
	return "the turn"
}

// RecordWait is how long a turn waits for its store to commit an event that
// carries a call record (WaitForStore) before it goes on: far more than
// any commit of a store that works takes, so that a crash loses no record;
// little enough that a store that is away or locked costs the turn next to
// nothing. The record stays queued and is stored once the store is back.
const RecordWait = 250 * time.Millisecond

// Enqueue queues e for s (Store.QueueEvent) and, when it carries a call
// record, waits for its commit for at most RecordWait; committed is
// QueueEvent's. The turn's sinks (the server's, Recorder) store events
// through it.
//
// A tool call refused before it ran (max_tool_calls, a stop, an unknown
// tool, bad arguments) is not waited for: nothing ran that a crash could
// leave unaccounted for, and a reply asking for 10,000 calls past the
// limit would otherwise wait for 10,000 commits one after the other
// (docs/decisions/refused-calls.md). Its record is committed with the
// group it is queued in, and before the turn's own (FinishTurn).
func Enqueue(s Store, e event.Event, committed func(error)) {
	if !WaitForStore(e) || Refused(e) {
		s.QueueEvent(e, committed)
		return
	}
	stored := make(chan struct{})
	s.QueueEvent(e, func(err error) {
		if committed != nil {
			committed(err)
		}
		close(stored)
	})
	t := time.NewTimer(RecordWait)
	defer t.Stop()
	select {
	case <-stored:
	case <-t.C:
	}
}

// Refused reports whether e ends a tool call that was refused, not run: a
// record no sink need wait for (Enqueue).
func Refused(e event.Event) bool {
	tf, ok := e.Data.(*event.ToolFinished)
	return ok && tf.Refused != ""
}

// WhyCancelled says why s signalled a cancel of turn id (WatchCancel),
// that this process runs: a client asked through another process (the
// store says who, CancelReasons; else client), or another process ended
// the turn, taking this one for gone — then the turn ends here as the
// store recorded it: Reason budget.Interrupted, By the stored message,
// which the turn's closing message repeats word for word. One cause, one
// message, everywhere.
func WhyCancelled(s Store, id, client string) *budget.CancelError {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if cr, ok := s.(CancelReasons); ok {
		if ce, err := cr.CancelReason(ctx, id); err == nil && ce != nil {
			if ce.By == "" {
				ce.By = client
			}
			return ce
		}
	}
	if rec, err := s.Turn(ctx, id); err == nil && rec.Status == budget.StatusInterrupted {
		return &budget.CancelError{Reason: budget.Interrupted, By: rec.Message}
	}
	return &budget.CancelError{Reason: budget.Cancelled, By: client}
}

// KeepLate reports whether an update of a tool call record from old to new
// must keep old: old holds a late result that new, written from the turn's
// final record, does not know of.
func KeepLate(old, new event.ToolCall) bool { return old.LateResult && !new.LateResult }
