// Package temporal runs timebox turns on Temporal, the durable-execution
// engine: a turn is a workflow that drives the embedded engine's turn
// machine (internal/machine), and each of its units of work — a model step,
// each tool call — is an activity that a worker runs with its own copy of
// the agent. The workflow keeps only the turn's small state; the
// conversation lives in the shared store, so no payload limit of
// Temporal's bounds it. The agent file, budgets, events, records and
// messages are the embedded engine's; only where the work runs changes.
// docs/decisions/temporal.md says how budgets, heartbeats, retries, a lost
// worker and a lost server map onto Temporal.
//
// A worker (NewWorker, `timebox worker`) runs the workflow and its
// activities and writes each event to the shared store (PostgreSQL) as it
// is emitted. A Runner (`timebox run --engine temporal`, `timebox serve
// --engine temporal`) starts a turn as a workflow and follows its events
// through the store, so a program uses it as it uses an *agent.Agent.
package temporal

import (
	"errors"
	"fmt"
	"time"

	"github.com/timebox-run/timebox/store"
)

// Names on the Temporal side.
const (
	// WorkflowName is the turn's workflow type.
	WorkflowName = "timebox.Turn"
	// SignalCancel asks a turn's workflow to stop; its value is a
	// budget.CancelError saying why and by whom.
	SignalCancel = "timebox.cancel"
	// SignalApproval, with ":" and a call id, wakes a call of the turn's
	// workflow waiting for a person's decision: the decision is in the
	// store (store.Approvals), which the call reads.
	SignalApproval = "timebox.approval"
	// DefaultTaskQueue is the task queue of workers and runners that name
	// none.
	DefaultTaskQueue = "timebox"
	// DefaultHeartbeat is DefaultHeartbeat: see Options.Heartbeat.
	DefaultHeartbeat = 3 * time.Second
	// Engine is the engine's name in stored turns (store.TurnStart.Engine):
	// a turn on a task queue other than DefaultTaskQueue is stored as run
	// by Engine, "/" and its queue (Runner.Engine).
	Engine = "temporal"
)

// engineOn returns the engine a turn on task queue q is stored as run by
// (store.TurnStart.Engine): Engine on DefaultTaskQueue (or none), as every
// turn stored before the queue was part of it, and Engine+"/"+q on
// another. A gateway adopts the turns of its own engine only
// (store.Followers): of its own queue, whose workers its notices name.
func engineOn(q string) string {
	if q == "" || q == DefaultTaskQueue {
		return Engine
	}
	return Engine + "/" + q
}

// Activity names.
const (
	actAdvance = "timebox.Advance"
	actCall    = "timebox.Call"
	actRefuse  = "timebox.Refuse"
	actRefuses = "timebox.RefuseCalls"
	actLost    = "timebox.Lost"
	actAsk     = "timebox.Ask"
	actDecided = "timebox.Decided"
	actRecover = "timebox.Recover"
	actEnd     = "timebox.End"
	actNotice  = "timebox.Notice"
)

// WorkflowID is the workflow id of a turn: one workflow per turn id, so
// starting a turn twice is refused.
func WorkflowID(turnID string) string { return "timebox-" + turnID }

// CheckHeartbeat checks a worker heartbeat interval (Options.Heartbeat).
func CheckHeartbeat(d time.Duration) error {
	if d < 500*time.Millisecond || d > time.Minute {
		return fmt.Errorf("worker heartbeat %v: use 500ms to 1m (a dead worker is noticed after about this long)", d)
	}
	return nil
}

// Errors of NewWorker and NewRunner.
var (
	errNoStore    = errors.New("temporal: a store is required (the workers and runners of one task queue share one PostgreSQL database)")
	errNoPayloads = errors.New("temporal: the store must keep payloads (store.Payloads: PostgreSQL, or Memory in tests): turns' conversations live there")
	errNoAgent    = errors.New("temporal: an *agent.Agent is required")
)

// storesOf returns what the engine needs of a store.
func storesOf(s store.Store) (store.Payloads, store.Interrupter, error) {
	if s == nil {
		return nil, nil, errNoStore
	}
	p, ok := s.(store.Payloads)
	if !ok {
		return nil, nil, errNoPayloads
	}
	in, ok := s.(store.Interrupter)
	if !ok {
		return nil, nil, fmt.Errorf("temporal: the store must end turns from outside (store.Interrupter): PostgreSQL, or Memory in tests")
	}
	return p, in, nil
}
