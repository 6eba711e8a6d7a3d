package temporal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
)

// Runner starts turns as workflows and follows them through the store. It
// runs turns as an *agent.Agent does — Run returns the turn's record and
// messages, and its events reach the sinks in seq order — so a program,
// `timebox run` and the server use it in the agent's place. The turns'
// events and records are stored by the workers: a Runner's caller must not
// store them again (Engine says so).
type Runner struct {
	client    client.Client
	store     store.Store
	taskQueue string
	agent     *agent.Agent
}

// NewRunner returns a runner that starts turns on task queue (empty:
// DefaultTaskQueue) and reads them from s, the store the workers write to.
// a, if not nil, is the agent the workers run, used to check a request's
// budgets before its turn starts (TurnBudgets).
func NewRunner(c client.Client, s store.Store, taskQueue string, a *agent.Agent) (*Runner, error) {
	if s == nil {
		return nil, errNoStore
	}
	if taskQueue == "" {
		taskQueue = DefaultTaskQueue
	}
	return &Runner{client: c, store: s, taskQueue: taskQueue, agent: a}, nil
}

// Engine names the engine: the turns a Runner starts are stored as run
// by it (store.TurnStart.Engine), and stored by its workers.
func (r *Runner) Engine() string { return Engine }

// TurnBudgets checks a request's budgets as the workers' agent will
// (agent.Agent.TurnBudgets); without an agent every request is accepted.
func (r *Runner) TurnBudgets(req budget.Request) (budget.Budgets, budget.Limits, error) {
	if r.agent == nil {
		return budget.Budgets{}, budget.Limits{}, nil
	}
	return r.agent.TurnBudgets(req)
}

// Run starts the turn as a workflow and returns once it has ended, with
// its record as the workers stored it. Cancelling ctx cancels the turn as
// it cancels an agent's: a cancel signal with the cause, and a cancel
// request in the store, which reaches the running units at once.
func (r *Runner) Run(ctx context.Context, in agent.Input, sinks ...event.Sink) *agent.Result {
	if in.TurnID == "" {
		in.TurnID = agent.NewTurnID()
	}
	started := time.Now()
	bg := context.WithoutCancel(ctx)
	startCtx, cancelStart := context.WithTimeout(bg, 30*time.Second)
	run, err := r.client.ExecuteWorkflow(startCtx, client.StartWorkflowOptions{ID: WorkflowID(in.TurnID), TaskQueue: r.taskQueue},
		WorkflowName, in)
	cancelStart()
	if err != nil {
		return r.failed(in, started, fmt.Errorf("the turn could not be started on Temporal: %w", err), nil)
	}

	var out Outcome
	ended := make(chan error, 1)
	go func() { ended <- run.Get(bg, &out) }()
	changed, unwatch := r.store.Watch(in.TurnID)
	defer unwatch()

	var (
		events   []event.Event
		after    int64
		finished bool
		wfErr    error
		wfDone   bool
		done     = ctx.Done()
		gaveUp   <-chan time.Time
	)
	read := func() error {
		evs, err := r.store.Events(bg, in.TurnID, after, 0)
		if err != nil {
			return err // read again at the next signal
		}
		for _, e := range evs {
			after = e.Seq
			events = append(events, e)
			for _, s := range sinks {
				s.Emit(e)
			}
			finished = finished || e.Type == event.TypeTurnFinished
		}
		return nil
	}
	// readToEnd reads what the workers stored before the workflow ended:
	// its turn_finished is stored by then, so only a failing store keeps it
	// from being read, a few times over.
	readToEnd := func() {
		for try := 0; !finished && try < 5; try++ {
			if read() == nil && finished {
				return
			}
			time.Sleep(time.Duration(try+1) * 100 * time.Millisecond)
		}
	}
	for !(finished && wfDone) {
		read()
		if finished && wfDone {
			break
		}
		if wfDone && !finished {
			readToEnd()
			if !finished {
				return r.failed(in, started, errors.New("the turn's workflow ended, but its end could not be read from the store"), events)
			}
			break
		}
		select {
		case <-changed:
		case wfErr = <-ended:
			wfDone = true
			if wfErr != nil {
				readToEnd()
				if !finished {
					return r.failed(in, started, fmt.Errorf("the turn's workflow failed: %w", wfErr), events)
				}
			}
		case <-done:
			done = nil
			r.cancel(bg, in.TurnID, budget.Cause(ctx))
			t := time.NewTimer(CancelWait)
			defer t.Stop()
			gaveUp = t.C
		case <-gaveUp:
			// No worker ended the turn: none is running, or none can
			// reach the store. The workflow is terminated so that no
			// worker starts it later.
			tctx, cancel := context.WithTimeout(bg, 10*time.Second)
			_ = r.client.TerminateWorkflow(tctx, WorkflowID(in.TurnID), "", "cancelled, and no worker ended it within "+CancelWait.String())
			cancel()
			return r.failed(in, started, fmt.Errorf("it was cancelled, and no worker ended it within %s (is a timebox worker running on task queue %s?)",
				CancelWait, r.taskQueue), events)
		}
	}
	rec, err := r.store.Turn(bg, in.TurnID)
	if err != nil {
		return r.failed(in, started, fmt.Errorf("reading the record of the turn: %w", err), events)
	}
	rec.Events = events
	return &agent.Result{Record: rec, Messages: out.Messages}
}

// CancelWait is how long Run waits, after its context was cancelled, for a
// worker to end the turn before it terminates the workflow and returns:
// without a worker a turn would never end.
var CancelWait = 30 * time.Second

// cancel asks the turn's workflow to stop for cause: a signal carrying it,
// and a cancel request in the store for the units running now.
func (r *Runner) cancel(ctx context.Context, turnID string, cause error) {
	ce, ok := budget.AsCancel(cause)
	if !ok {
		ce = &budget.CancelError{Reason: budget.Cancelled, By: "the caller"}
		if te, ok := budget.AsTimeout(cause); ok {
			ce.By = "the caller's deadline (" + te.Error() + ")"
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = r.client.SignalWorkflow(sctx, WorkflowID(turnID), "", SignalCancel, ce)
	if err := r.store.RequestCancel(sctx, turnID); err != nil && !errors.Is(err, store.ErrNotRunning) {
		_ = err // the signal carries it; the store only makes it sooner
	}
}

// failed returns the result of a turn that could not run or be followed
// to its end, and stores it as interrupted if the workers did not end it.
func (r *Runner) failed(in agent.Input, started time.Time, err error, events []event.Event) *agent.Result {
	now := time.Now()
	rec := &event.Turn{TurnID: in.TurnID, SessionID: in.SessionID, Input: in.Text, StartedAt: started, EndedAt: now,
		WallMS: now.Sub(started).Milliseconds(), Status: budget.StatusInterrupted, StopReason: budget.Interrupted,
		Message: fmt.Sprintf("Interrupted: %v. Send the message again.", err), Events: events}
	if r.agent != nil {
		rec.Agent = r.agent.Name()
	}
	if stored, serr := r.store.Turn(context.Background(), in.TurnID); serr == nil && stored.Status != budget.StatusRunning {
		stored.Events = events
		return &agent.Result{Record: stored}
	}
	if serr := r.store.FinishTurn(context.Background(), rec, nil); serr != nil {
		rec.Message += fmt.Sprintf(" (The record could not be stored either: %v.)", serr)
	}
	return &agent.Result{Record: rec}
}
