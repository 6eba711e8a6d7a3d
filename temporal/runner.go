package temporal

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"go.temporal.io/api/enums/v1"
	historypb "go.temporal.io/api/history/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"go.temporal.io/sdk/converter"
	sdktemporal "go.temporal.io/sdk/temporal"
	"golang.org/x/time/rate"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/store"
)

// Runner starts turns as workflows and follows them through the store. It
// runs turns as an *agent.Agent does — Run returns the turn's record and
// messages, and its events reach the sinks in seq order — so a program,
// `timebox run` and the server use it in the agent's place. The turns'
// events and records are stored by the workers: a Runner's caller must not
// store them again (Engine says so).
//
// A turn carries what its runner resolved: its budgets (the agent's, with
// the runner's flags and environment, and the request's) and which agent
// it was started with, so that a worker built from another agent file
// refuses it (stop reason agent_mismatch) rather than run it.
type Runner struct {
	client    client.Client
	store     store.Store
	payloads  store.Payloads
	ends      store.Interrupter
	taskQueue string
	agent     *agent.Agent
	units     machine.Units
	// followers and owner say who follows a turn and who this runner's
	// process is (its store's owner), when its store knows
	// (store.Followers, store.Owned): a follower that is no longer its
	// turn's stops following it (followedElsewhere).
	followers store.Followers
	owner     string
	// checks paces the engine checks of every turn the runner follows
	// (EngineChecksPerSecond).
	checks *rate.Limiter
}

// NewRunner returns a runner that starts turns on task queue (empty:
// DefaultTaskQueue) for agent a and reads them from s, the store the
// workers write to (PostgreSQL).
func NewRunner(c client.Client, s store.Store, taskQueue string, a *agent.Agent) (*Runner, error) {
	p, ends, err := storesOf(s)
	if err != nil {
		return nil, err
	}
	units, ok := machine.UnitsOf(a)
	if !ok {
		return nil, errNoAgent
	}
	if taskQueue == "" {
		taskQueue = DefaultTaskQueue
	}
	r := &Runner{client: c, store: s, payloads: p, ends: ends, taskQueue: taskQueue, agent: a, units: units,
		checks: rate.NewLimiter(rate.Inf, 1)}
	if EngineChecksPerSecond > 0 {
		r.checks = rate.NewLimiter(rate.Limit(EngineChecksPerSecond), 1)
	}
	fs, ok := s.(store.Followers)
	if o, owned := s.(store.Owned); ok && owned {
		r.followers, r.owner = fs, o.Owner()
	}
	return r, nil
}

// Engine names the engine and the runner's task queue: the turns a Runner
// starts are stored as run by it (store.TurnStart.Engine), and stored by
// its workers. It is Engine on DefaultTaskQueue, and Engine, "/" and the
// queue on another ("temporal/billing"), so that a gateway adopts only
// the turns of its own queue (server.Adopter, store.Followers).
func (r *Runner) Engine() string { return engineOn(r.taskQueue) }

// TurnBudgets checks a request's budgets as the turn will run them
// (agent.Agent.TurnBudgets).
func (r *Runner) TurnBudgets(req budget.Request) (budget.Budgets, budget.Limits, error) {
	return r.agent.TurnBudgets(req)
}

// EngineCheck is how often Run asks Temporal how the turn's workflow is
// while it follows the turn, and EngineGrace how long Temporal may be out
// of reach before the turn is taken for lost: it then ends interrupted,
// stop reason engine_lost, with its end stored and streamed.
var (
	EngineCheck = 2 * time.Second
	EngineGrace = 30 * time.Second
)

// EngineChecksPerSecond bounds the engine checks a Runner makes, over
// every turn it follows, when NewRunner makes it: each turn is checked
// every EngineCheck, or every n/EngineChecksPerSecond when the runner
// follows n turns, whichever is longer — a gateway that adopted
// thousands of orphans asks Temporal at that rate, not thousands of times
// every EngineCheck, and notes their waits and ends them past their
// budgets that much later. Zero or less: no bound.
var EngineChecksPerSecond = 250

// WorkerWait is how long a turn's work may wait for a worker to take it
// before the turn says so: a still_working notice whose waiting field says
// that no worker has taken it, and on which task queue one must run. It
// is a notice, not a stop: the turn goes on when a worker comes (its
// ceiling and step window aside: past either, the same judgement stops
// the turn, unworkedPast). Without it a turn whose every worker died looked
// like a call running on.
var WorkerWait = 10 * time.Second

// Run starts the turn as a workflow and returns once it has ended, with
// its record as the workers stored it. Cancelling ctx cancels the turn as
// it cancels an agent's: a cancel signal with the cause, and a cancel
// request in the store, which reaches the running units at once.
//
// A turn whose workflow is gone (a Temporal server that lost its data) or
// whose Temporal server is out of reach for EngineGrace ends interrupted
// with stop reason engine_lost: Run ends it in the store, so its end is
// stored and streamed, and the units still running somewhere stop when
// they see it.
func (r *Runner) Run(ctx context.Context, in agent.Input, sinks ...event.Sink) *agent.Result {
	if in.TurnID == "" {
		in.TurnID = agent.NewTurnID()
	}
	s, history := r.units.NewState(in.TurnID, in.SessionID, in.History, in.Budgets)
	// The turn's span is begun here; its workers' spans are its children,
	// by the traceparent the state carries. It is ended here for an end
	// this Run wrote, or read; a worker that stores the turn's end makes
	// the span itself when it can (keyTurnSpan), since the turn may end
	// long after this process stopped following it, or died.
	end, leave := agent.TraceTurn(r.agent, ctx, s)
	f := &follow{r: r, in: in, started: s.Start, state: s, sinks: sinks}
	res := r.run(ctx, f, history)
	if f.own || (res.Record.Status != budget.StatusRunning && !f.workerSpan(context.WithoutCancel(ctx))) {
		end(res)
		if e := f.ending; e != nil {
			// An end this Run stored (store.Interrupt) records the calls
			// that were running interrupted, and ends the model attempt
			// under way: their workers died, or were given up and left
			// their spans unended. Their spans are made here, with the
			// ids their tool_started and llm_started carry.
			agent.TraceLost(r.agent, s, res.Record, e.Attempt, e.Calls...)
		}
	} else {
		leave()
	}
	return res
}

// Adopt follows turn in.TurnID, which another process started and no
// longer follows — its follower is gone (store.Followers) — as Run follows
// its own, and returns once it has ended, or once ctx is cancelled with
// agent.ErrStopFollowing. The follower is the same: it notes the turn's
// waits for a worker (once for each wait, whoever noted it before), ends
// it at its ceiling or the end of its step window when no worker runs it,
// ends it engine_lost when its workflow is gone, and cancelling ctx
// cancels the turn. The turn's budgets and start are those it was started
// with: its workflow's input, the state Run started it with
// (startedState); its waits for people, and what it did, are its events.
// The rest of in (an Approver) is used as Run uses it.
//
// The turn's span was begun by the process that started it: its end,
// stored here or by a worker, is made by whoever stores it
// (store.Options.Ended, agent.TraceEnded), not by Adopt.
func (r *Runner) Adopt(ctx context.Context, in agent.Input, sinks ...event.Sink) *agent.Result {
	bg := context.WithoutCancel(ctx)
	var rec *event.Turn
	for {
		// The turn is this follower's now: a store away for a while
		// leaves it followed later, not never.
		var err error
		if rec, err = r.payloads.TurnWithoutResults(bg, in.TurnID); err == nil {
			break
		}
		unread := &agent.Result{Record: &event.Turn{TurnID: in.TurnID, Status: budget.StatusRunning,
			Message: fmt.Sprintf("The turn could not be read from the store to follow it (%v).", err)}}
		if errors.Is(err, store.ErrNotFound) {
			return unread
		}
		t := time.NewTimer(EngineCheck)
		select {
		case <-ctx.Done():
			t.Stop()
			return unread
		case <-t.C:
		}
	}
	in.SessionID, in.Text = rec.SessionID, rec.Input
	f := &follow{r: r, in: in, started: rec.StartedAt, sinks: sinks}
	var err error
	for since := time.Now(); ; {
		if f.state, err = r.startedState(bg, rec); err == nil {
			break
		}
		// Out of reach: the follower's rule (run) holds meanwhile.
		if time.Since(since) >= EngineGrace {
			return f.end(bg, budget.EngineLost, fmt.Sprintf("the Temporal server could not be reached for %s (%v)", budget.Round(time.Since(since)), err))
		}
		t := time.NewTimer(EngineCheck)
		select {
		case <-ctx.Done():
			t.Stop()
			return &agent.Result{Record: &event.Turn{TurnID: in.TurnID, Status: budget.StatusRunning}}
		case <-t.C:
		}
	}
	return f.run(ctx, r.client.GetWorkflow(bg, WorkflowID(in.TurnID), ""))
}

// startedState returns the state turn rec's workflow was started with,
// its first run's input: the budgets the turn runs with, and the start
// its ceiling counts from, as the workflow counts them (the turn's
// turn_started is stored by its first unit, later, and not at all when no
// worker ever took the turn). A workflow Temporal no longer has leaves the
// turn the runner's agent's budgets, from its stored start (its follower
// ends it engine_lost at once), as does an input this timebox cannot
// read. err is that Temporal could not be asked.
func (r *Runner) startedState(ctx context.Context, rec *event.Turn) (*machine.State, error) {
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	agents := func() (*machine.State, error) {
		s := &machine.State{TurnID: rec.TurnID, SessionID: rec.SessionID, Start: rec.StartedAt}
		s.Budgets, s.Limits, _ = r.agent.TurnBudgets(budget.Request{})
		return s, nil
	}
	d, err := r.client.DescribeWorkflowExecution(hctx, WorkflowID(rec.TurnID), "")
	if isGone(err) {
		return agents()
	}
	if err != nil {
		return nil, err
	}
	first := func(run string) (*historypb.HistoryEvent, error) {
		it := r.client.GetWorkflowHistory(hctx, WorkflowID(rec.TurnID), run, false, enums.HISTORY_EVENT_FILTER_TYPE_ALL_EVENT)
		if !it.HasNext() {
			return nil, fmt.Errorf("the workflow of turn %s has no history", rec.TurnID)
		}
		return it.Next()
	}
	e, err := first(d.GetWorkflowExecutionInfo().GetFirstRunId())
	if isGone(err) {
		// The first run, continued as new, is past Temporal's retention:
		// the run's own start carries the turn's start and budgets too,
		// and its waits for people so far, which the events count again
		// (the ceiling later, never earlier).
		e, err = first("")
	}
	if err != nil {
		return nil, err
	}
	var s machine.State
	a := e.GetWorkflowExecutionStartedEventAttributes()
	if a == nil || converter.GetDefaultDataConverter().FromPayloads(a.GetInput(), &s) != nil || s.TurnID != rec.TurnID {
		return agents() // not a turn's workflow as this timebox starts one
	}
	return &s, nil
}

// workerSpan reports whether the worker that stored the turn's end made
// its span (keyTurnSpan).
func (f *follow) workerSpan(ctx context.Context) bool {
	err := f.r.payloads.Payload(ctx, f.in.TurnID, keyTurnSpan, func([]byte) error { return nil })
	return err == nil
}

func (r *Runner) run(ctx context.Context, f *follow, history []model.Message) *agent.Result {
	bg := context.WithoutCancel(ctx)
	in, s := f.in, f.state
	ts := store.TurnStart{TurnID: in.TurnID, SessionID: in.SessionID, Engine: r.Engine(), Agent: r.agent.Name(), Input: in.Text, StartedAt: s.Start}
	if o, ok := r.store.(store.Owned); ok {
		// The turn is this Run's: when its process is gone, the turn is
		// cancelled as client_gone (a server begins the turns of detached
		// requests itself, without a caller), and a live gateway adopts
		// it (Adopt).
		ts.Caller, ts.Follower = o.Owner(), o.Owner()
	}
	if err := r.store.BeginTurn(bg, ts); err != nil && !errors.Is(err, store.ErrExists) {
		return f.failed(bg, fmt.Errorf("the turn could not be stored: %w", err))
	}
	var run client.WorkflowRun
	err := putInput(bg, r.payloads, in.TurnID, in.Text, history)
	if _, summary, _ := agent.SplitSummary(in.History); err == nil && s.Summarised {
		// The session's last summary, which the state says the turn
		// starts from: its units read it as they read one of its own.
		err = r.payloads.PutPayloads(bg, in.TurnID, map[string][]byte{keySummary: []byte(summary)})
	}
	if err != nil {
		return f.end(bg, budget.Interrupted, fmt.Sprintf("its conversation could not be stored (%v)", err))
	}
	startCtx, cancelStart := context.WithTimeout(bg, 30*time.Second)
	run, err = r.client.ExecuteWorkflow(startCtx, client.StartWorkflowOptions{ID: WorkflowID(in.TurnID), TaskQueue: r.taskQueue,
		WorkflowTaskTimeout: workflowTaskTimeout}, WorkflowName, s)
	cancelStart()
	if err != nil {
		return f.end(bg, budget.EngineLost, fmt.Sprintf("the turn could not be started on Temporal (%v)", err))
	}
	return f.run(ctx, run)
}

// follow is one Run following its turn.
type follow struct {
	r       *Runner
	in      agent.Input
	started time.Time
	// state is the turn's state as it was started: its budgets, and the
	// start its ceiling counts from.
	state  *machine.State
	sinks  []event.Sink
	events []event.Event
	after  int64
	// own is set when the turn's end is this follower's: it stored it, or
	// could not store it; ending is how it stored it (endAs).
	own    bool
	ending *store.Ending
	// finished is set once turn_finished was read; rec once the turn's
	// record was read ended (recorded).
	finished bool
	rec      *event.Turn
	// waitNoted is since when the work the last waiting notice was about
	// had waited for a worker, so that one wait is noted once: by this
	// follower, or by one before it (an adopted turn), as read from the
	// notice (read).
	waitNoted time.Time
	// The questions put to in.Approver (ask), by call and round, and
	// what ends them with the Run.
	asked     map[string]bool
	asks      sync.WaitGroup
	askCtx    context.Context
	askCancel context.CancelFunc
}

// ask puts a call waiting for a person's decision (approval_requested) to
// the Run's Approver — a terminal's prompt, a program's — and stores its
// decision and signals the workflow, as the server's route does. Without
// an answer the workflow's own timer expires the call.
func (f *follow) ask(e event.Event, d *event.ApprovalRequested) {
	if f.in.Approver == nil {
		return
	}
	round := max(1, d.Round)
	key := d.CallID + "#" + strconv.Itoa(round)
	if f.asked[key] {
		return
	}
	if f.asked == nil {
		f.asked = map[string]bool{}
		f.askCtx, f.askCancel = context.WithCancel(context.Background())
	}
	f.asked[key] = true
	req := agent.ApprovalRequest{TurnID: f.in.TurnID, SessionID: f.in.SessionID, Step: d.Step, CallID: d.CallID, Tool: d.Tool,
		Arguments: d.Arguments, RequestedAt: e.At, ExpiresAt: d.ExpiresAt, Round: round}
	f.asks.Add(1)
	go func() {
		defer f.asks.Done()
		ctx, cancel := context.WithDeadline(f.askCtx, d.ExpiresAt)
		defer cancel()
		dec, err := f.in.Approver.Approve(ctx, req)
		ap, ok := f.r.store.(store.Approvals)
		if err != nil || !ok || (dec.Decision != event.Approve && dec.Decision != event.Deny) {
			return
		}
		if dec.At.IsZero() {
			dec.At = time.Now()
		}
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		if _, err := ap.Decide(sctx, req.TurnID, req.CallID, store.Approval{Decision: dec.Decision, By: dec.By, Reason: dec.Reason,
			DecidedAt: dec.At}); err == nil || errors.Is(err, store.ErrDecided) {
			_ = f.r.SignalApproval(sctx, req.TurnID, req.CallID)
		}
	}()
}

// stopAsking ends the questions still put to the Approver.
func (f *follow) stopAsking() {
	if f.askCancel != nil {
		f.askCancel()
	}
	f.asks.Wait()
}

func (f *follow) run(ctx context.Context, run client.WorkflowRun) *agent.Result {
	r := f.r
	bg := context.WithoutCancel(ctx)
	id := f.in.TurnID
	ended := make(chan error, 1)
	// The wait for the workflow's end ends with the follow: a follow that
	// ends the turn itself (engine_lost, Temporal out of reach) left it
	// retrying against the server, a goroutine per turn, until the
	// client was closed.
	gctx, stopGet := context.WithCancel(bg)
	defer stopGet()
	go func() {
		var out Outcome
		ended <- run.Get(gctx, &out)
	}()
	defer f.stopAsking()
	changed, unwatch := r.store.Watch(id)
	defer unwatch()
	check := time.NewTicker(EngineCheck)
	defer check.Stop()
	var (
		done        = ctx.Done()
		gaveUp      <-chan time.Time
		unreachable time.Time // since when Temporal is out of reach
		// due is set while a check waits for its turn among the checks
		// of every turn the runner follows (EngineChecksPerSecond).
		due <-chan time.Time
	)
	// look is one check of the turn's engine: whether its workflow is
	// gone, what of its work waits for a worker, and whether it is past a
	// budget no worker enforces.
	look := func() *agent.Result {
		if f.followedElsewhere(bg) {
			// Taken for gone, and adopted: the turn runs on, followed
			// by its adopter, as after a shutdown.
			return f.result(bg)
		}
		d, gone, err := f.describe(bg)
		switch {
		case gone != "":
			if f.readToEnd(bg) {
				return f.result(bg)
			}
			return f.end(bg, budget.EngineLost, gone)
		case err == nil:
			unreachable = time.Time{}
			now, since := time.Now(), waitingSince(d)
			f.noteWait(bg, since, now)
			if fl, ok := f.unworkedPast(d, since, now); ok {
				return f.endAs(bg, r.stopEnd(bg, f.state, f.events, fl, now.Sub(since), now))
			}
		case unreachable.IsZero():
			unreachable = time.Now()
		case time.Since(unreachable) >= EngineGrace:
			return f.end(bg, budget.EngineLost, fmt.Sprintf("the Temporal server could not be reached for %s (%v)", budget.Round(time.Since(unreachable)), err))
		}
		return nil
	}
	for {
		f.read(bg)
		if f.finished && f.recorded(bg) {
			return f.result(bg)
		}
		select {
		case <-changed:
		case err := <-ended:
			ended = nil
			if f.readToEnd(bg) {
				return f.result(bg)
			}
			if err == nil {
				return f.end(bg, budget.Interrupted, "its workflow ended, but its end could not be read from the store")
			}
			if isGone(err) {
				return f.end(bg, budget.EngineLost, "Temporal lost its workflow (was the server restarted without its data?)")
			}
			var we *sdktemporal.WorkflowExecutionError
			if errors.As(err, &we) {
				return f.end(bg, budget.Interrupted, fmt.Sprintf("its workflow failed (%v)", errors.Unwrap(err)))
			}
			// Out of reach: the checks below decide.
		case <-check.C:
			if due != nil {
				break // the last check waits for its turn among the runner's
			}
			if wait := r.checkWait(); wait > 0 {
				due = time.After(wait)
				break
			}
			if res := look(); res != nil {
				return res
			}
		case <-due:
			due = nil
			if res := look(); res != nil {
				return res
			}
		case <-done:
			done = nil
			if errors.Is(context.Cause(ctx), agent.ErrStopFollowing) {
				// The server is going; the turn runs on on the workers.
				return f.result(bg)
			}
			r.cancel(bg, id, budget.Cause(ctx))
			t := time.NewTimer(CancelWait)
			defer t.Stop()
			gaveUp = t.C
		case <-gaveUp:
			// No worker ended the turn: none is running, or none can
			// reach the store. The workflow is terminated so that no
			// worker starts it later.
			return f.endAs(bg, r.unworked(bg, id, r.taskQueue, CancelWait))
		}
	}
}

// checkWait reserves the runner's next engine check and returns how long
// it waits for it (EngineChecksPerSecond).
func (r *Runner) checkWait() time.Duration {
	if r.checks == nil {
		return 0
	}
	return r.checks.Reserve().Delay()
}

// followedElsewhere reports whether the turn's follower, as the store
// says, is another process: this one was taken for gone — paused long
// enough (SIGSTOP, a long GC, a frozen VM) that a store sharing the
// database deleted its owner row — and a live gateway adopted the turn.
// It then stops following it, as at a shutdown, so that two followers do
// not say one wait twice. Its store registers again when it comes back,
// but the turn stays its adopter's (store.Followers). A store that cannot
// say leaves it following; a turn with no follower (begun by a process
// that named none) is followed as before.
func (f *follow) followedElsewhere(ctx context.Context) bool {
	if f.r.followers == nil {
		return false
	}
	fctx, cancel := context.WithTimeout(ctx, EngineCheck)
	defer cancel()
	who, err := f.r.followers.Follower(fctx, f.in.TurnID)
	return err == nil && who != "" && who != f.r.owner
}

// describe asks Temporal how the turn's workflow is: gone says why it can
// no longer end the turn (it is gone, or closed), err that Temporal could
// not be asked.
func (f *follow) describe(ctx context.Context) (d *workflowservice.DescribeWorkflowExecutionResponse, gone string, err error) {
	dctx, cancel := context.WithTimeout(ctx, EngineCheck)
	defer cancel()
	d, err = f.r.client.DescribeWorkflowExecution(dctx, WorkflowID(f.in.TurnID), "")
	switch {
	case isGone(err):
		return nil, "Temporal lost its workflow (was the server restarted without its data?)", nil
	case err != nil:
		return nil, "", err
	}
	switch st := d.GetWorkflowExecutionInfo().GetStatus(); st {
	case enums.WORKFLOW_EXECUTION_STATUS_RUNNING, enums.WORKFLOW_EXECUTION_STATUS_CONTINUED_AS_NEW, enums.WORKFLOW_EXECUTION_STATUS_COMPLETED:
		return d, "", nil // a completed one has stored the turn's end: read
	default:
		return d, fmt.Sprintf("its workflow ended %s", st), nil
	}
}

// waitingSince returns since when the oldest work of the workflow that no
// worker has taken has waited for one — a workflow task (a model step, or
// the turn's next move after a call ended or its worker was lost) or a
// tool call's activity — and zero when every piece of its work is taken.
// A turn waiting for a person, or for a timer, has no such work.
func waitingSince(d *workflowservice.DescribeWorkflowExecutionResponse) time.Time {
	var since time.Time
	note := func(ts ...*timestamppb.Timestamp) {
		var t time.Time
		for _, x := range ts { // the latest: a retry waits from its next attempt
			if x != nil && x.IsValid() && x.AsTime().After(t) {
				t = x.AsTime()
			}
		}
		if !t.IsZero() && (since.IsZero() || t.Before(since)) {
			since = t
		}
	}
	if wt := d.GetPendingWorkflowTask(); wt.GetState() == enums.PENDING_WORKFLOW_TASK_STATE_SCHEDULED {
		note(wt.GetScheduledTime())
	}
	for _, a := range d.GetPendingActivities() {
		if a.GetState() == enums.PENDING_ACTIVITY_STATE_SCHEDULED {
			note(a.GetScheduledTime(), a.GetNextAttemptScheduleTime())
		}
	}
	return since
}

// noteWait stores a still_working notice, once for each wait, when the
// turn's work has waited WorkerWait or longer for a worker at now.
func (f *follow) noteWait(ctx context.Context, since, now time.Time) {
	if since.IsZero() || now.Sub(since) < WorkerWait || sameWait(since, f.waitNoted) || f.finished {
		return
	}
	f.waitNoted = since
	waited := now.Sub(since)
	step := 0
	for _, e := range f.events {
		switch d := e.Data.(type) {
		case *event.LLMStarted:
			step = max(step, d.Step)
		case *event.ToolStarted:
			step = max(step, d.Step)
		}
	}
	n := &event.StillWorking{Step: step, Subject: noWorker, ElapsedMS: waited.Milliseconds(),
		Waiting: fmt.Sprintf("no timebox worker has taken this turn's work for %s. Is one running on task queue %q, "+
			"with this agent file? The turn goes on when one does; its ceiling and step window count meanwhile, and stop it if none comes; "+
			"a cancel ends it %s after it is asked if none comes.", budget.Round(waited), f.r.taskQueue, CancelWait)}
	// Numbered by the store (seq 0), among the workers' events; a turn
	// that ended meanwhile takes no more events.
	_ = f.r.store.AppendEvent(ctx, event.Event{TurnID: f.in.TurnID, Type: event.TypeStillWorking, At: now, Data: n})
}

// noWorker is the subject of a waiting notice.
const noWorker = "no worker"

// sameWait reports whether a wait since a and one since b are one: b read
// back from a notice is a, to the millisecond its elapsed time is counted
// in. Two waits are WorkerWait apart at least: the first had waited that
// long when it was noted, and the next began after it ended.
func sameWait(a, b time.Time) bool {
	d := a.Sub(b)
	return d > -time.Second && d < time.Second
}

// CeilingGrace is how long past a turn-level budget that fell — its
// ceiling, or the end of its step window — and its kill grace the process
// following the turn leaves it to a worker before it ends the turn itself,
// when no worker takes its work (unworkedPast): a live worker stops the
// turn's tools when either falls and ends the turn within the kill grace,
// so that its own end, the embedded engine's, always comes first.
var CeilingGrace = 5 * time.Second

// A fall is a turn-level budget of a turn that fell while no worker ran
// it: its ceiling (reason turn_timeout) or the end of its step window
// (no_progress), at when; progressed is, for the step, the last progress
// signal, from which the window ran.
type fall struct {
	reason     budget.StopReason
	at         time.Time
	progressed time.Time
}

// unworkedPast reports whether the turn is past a turn-level budget that
// only a worker enforces, and which fell first, while no worker runs the
// turn: its work has waited WorkerWait or longer for a worker since since
// (the judgement of the waiting notice, noteWait), no worker has any of it
// in hand, and now is CeilingGrace past the first of its ceiling and the
// end of its step window (firstFall), and its kill grace. One rule for
// both budgets: whichever fell first stops the turn, as on the embedded
// engine. (llm_budget needs none: no model time accrues without a worker.)
func (f *follow) unworkedPast(d *workflowservice.DescribeWorkflowExecutionResponse, since, now time.Time) (fall, bool) {
	if f.finished || since.IsZero() || now.Sub(since) < WorkerWait || taken(d) {
		return fall{}, false
	}
	first, ok := firstFall(f.state, f.events)
	return first, ok && !now.Before(first.at.Add(f.state.Budgets.KillGrace.D+CeilingGrace))
}

// firstFall returns the first of the turn's ceiling and the end of its
// step window, as its followed events tell them, for the turn of state s
// as it was started; ok is false when neither falls while the turn is as
// its events leave it.
//
// The ceiling is the turn's start plus timeouts.turn plus its waits for
// nothing but people (machine.Pauses); a turn waiting for a person now is
// not past it. The events tell a call working from its tool_started, a
// little later than the workflow counts it, so that the waits counted are
// never shorter than the workflow's and the ceiling never earlier.
//
// The step window (timeouts.step) runs from the turn's start or its last
// progress signal, as the embedded engine's watchdog counts them: a
// model's text (llm_delta), a tool's report (tool_progress, at most
// tool.ProgressInterval after it was made), the end of a call
// (tool_finished), a person's decision (approval_decided); and the end of
// a model call or compaction, or a failover, whatever the outcome — an
// attempt may have streamed tool-call arguments, progress no event shows,
// until just before. Those are all events after the signals they stand
// for, so the window never ends earlier than the units count it; a unit
// lost with its worker loses its progress with it, and the state the
// workflow goes on from carries only that of the units that ended, all
// shown by events. As on the embedded engine, a call still inside its own
// timeout keeps the window open to its deadline, and the window does not
// end while an advisory call runs or a call waits for a person.
func firstFall(s *machine.State, events []event.Event) (fall, bool) {
	b := s.Budgets
	p := &machine.Pauses{Total: s.ApprovalWait}
	progressed := s.Start
	waits, works := map[string]bool{}, map[string]*event.ToolStarted{}
	unwait := func(id string, at time.Time) {
		if waits[id] {
			delete(waits, id)
			p.Change(at, -1, 0)
		}
	}
	for _, e := range events {
		switch x := e.Data.(type) {
		case *event.ApprovalRequested:
			if !waits[x.CallID] {
				waits[x.CallID] = true
				p.Change(e.At, 1, 0)
			}
		case *event.ApprovalDecided:
			unwait(x.CallID, e.At)
		case *event.ToolStarted:
			unwait(x.CallID, e.At)
			if works[x.CallID] == nil {
				p.Change(e.At, 0, 1)
			}
			works[x.CallID] = x // a retry's: its deadline
		case *event.ToolFinished:
			unwait(x.CallID, e.At)
			if works[x.CallID] != nil {
				delete(works, x.CallID)
				p.Change(e.At, 0, -1)
			}
		}
		switch e.Data.(type) {
		case *event.LLMDelta, *event.LLMFinished, *event.Failover, *event.ToolProgress, *event.ToolFinished,
			*event.ApprovalDecided, *event.CompactionFinished:
			if e.At.After(progressed) {
				progressed = e.At
			}
		}
	}
	var first fall
	ok := false
	consider := func(x fall) {
		if !ok || x.at.Before(first.at) {
			first, ok = x, true
		}
	}
	if !b.Turn.Off() && !p.Paused() {
		consider(fall{reason: budget.TurnTimeout, at: s.Start.Add(b.Turn.D + p.Total)})
	}
	if b.Step.Off() || len(waits) > 0 {
		return first, ok
	}
	end := progressed.Add(b.Step.D)
	for _, c := range works {
		if c.Enforcement == budget.Advisory {
			return first, ok
		}
		if c.Deadline.After(end) {
			end = c.Deadline
		}
	}
	consider(fall{reason: budget.NoProgress, at: end, progressed: progressed})
	return first, ok
}

// taken reports whether a worker has some of the workflow's work in hand:
// its workflow task, or a call's activity, started.
func taken(d *workflowservice.DescribeWorkflowExecutionResponse) bool {
	if d.GetPendingWorkflowTask().GetState() == enums.PENDING_WORKFLOW_TASK_STATE_STARTED {
		return true
	}
	for _, a := range d.GetPendingActivities() {
		if a.GetState() == enums.PENDING_ACTIVITY_STATE_STARTED || a.GetState() == enums.PENDING_ACTIVITY_STATE_CANCEL_REQUESTED {
			return true
		}
	}
	return false
}

// stopEnd terminates the workflow of the turn of state s, past a
// turn-level budget that fell as fl says (unworkedPast) at now with its
// work waiting waited for a worker, so that no worker starts it later, and
// returns its end as the embedded engine's: stopped, turn_timeout or
// no_progress, its message, flags and limit in its words and by its rules
// (agent.Agent.StopOf), which say what the turn was doing at the fall as
// its events tell it — the calls that were running, a model call waiting
// for its reply, a compaction, the last step finished — then that no
// worker ran the turn. The calls that were running get the record of any
// call whose worker was lost before it ended: interrupted. events are the
// turn's events followed.
func (r *Runner) stopEnd(ctx context.Context, s *machine.State, events []event.Event, fl fall, waited time.Duration, now time.Time) store.End {
	past := now.Sub(fl.at)
	cause := &machine.Cause{Timeout: s.Budgets.Turn.Expired(budget.PhaseTurn, "the turn", s.Budgets.Turn.D+past)}
	fell, what := "its ceiling fell", "its ceiling"
	if fl.reason == budget.NoProgress {
		cause = &machine.Cause{Timeout: s.Budgets.Step.Expired(budget.PhaseStep, "the turn", now.Sub(fl.progressed))}
		fell, what = "nothing progressed for its step window ("+s.Budgets.Step.Knob+")", "the end of its step window"
	}
	why := fmt.Sprintf("%s, and no timebox worker ran it on task queue %s to stop it there", fell, r.taskQueue)
	r.terminate(ctx, s.TurnID, why)
	return store.End{Reason: fl.reason, Why: why,
		Stop: func(running []event.ToolCall) store.Stopped {
			msg, flags, limit := r.agent.StopOf(s, machine.Ending{Reason: fl.reason, Cause: cause}, events, running, fl.at, now)
			msg += fmt.Sprintf(" No timebox worker ran the turn on task queue %s to stop it there (its work waited %s for one): it was stopped %s past %s, and its workflow was terminated.",
				r.taskQueue, budget.RoundHuman(waited), budget.RoundHuman(past), what)
			return store.Stopped{Message: msg, Flags: flags, Limit: limit}
		}}
}

func isGone(err error) bool {
	var nf *serviceerror.NotFound
	return errors.As(err, &nf)
}

// read passes the events stored after the last one read to the sinks.
func (f *follow) read(ctx context.Context) error {
	evs, err := f.r.store.Events(ctx, f.in.TurnID, f.after, 0)
	if err != nil {
		return err // read again at the next signal
	}
	for _, e := range evs {
		f.after = e.Seq
		f.events = append(f.events, e)
		for _, s := range f.sinks {
			s.Emit(e)
		}
		f.finished = f.finished || e.Type == event.TypeTurnFinished
		switch d := e.Data.(type) {
		case *event.ApprovalRequested:
			f.ask(e, d)
		case *event.StillWorking:
			if d.Subject == noWorker && d.Waiting != "" {
				// A waiting notice (noteWait): stored at the look, as long
				// after the wait began as it says.
				f.waitNoted = e.At.Add(-time.Duration(d.ElapsedMS) * time.Millisecond)
			}
		}
	}
	return nil
}

// readToEnd reads what the workers stored before the workflow ended: its
// turn_finished is stored by then, so only a failing store keeps it from
// being read, a few times over.
func (f *follow) readToEnd(ctx context.Context) bool {
	for try := 0; !f.finished && try < 5; try++ {
		if f.read(ctx) == nil && f.finished {
			break
		}
		time.Sleep(time.Duration(try+1) * 100 * time.Millisecond)
	}
	return f.finished
}

// recorded reports whether the turn's record is stored: a unit stores it
// just after its turn_finished. The record read, without its calls'
// results, is kept for result.
func (f *follow) recorded(ctx context.Context) bool {
	rec, err := f.r.payloads.TurnWithoutResults(ctx, f.in.TurnID)
	if err != nil || rec.Status == budget.StatusRunning {
		return false
	}
	f.rec = rec
	return true
}

// result returns the ended turn: its record as stored, its events as
// followed, and the messages it added.
//
// A call's result is in its tool_finished, its record and its message.
// The record is read without results (store.Payloads.TurnWithoutResults),
// and takes each from its tool_finished, which the store wrote with the
// record and from the same value: a late result changes a record's
// late_output, never its result. The message shares the event's copy
// too, as on the embedded engine. (Ten 5 MB results were held three
// times over, then twice for a moment: issue 29.) A record no followed
// event carried is read whole.
func (f *follow) result(ctx context.Context) *agent.Result {
	rec := f.rec
	if rec == nil {
		var err error
		if rec, err = f.r.payloads.TurnWithoutResults(ctx, f.in.TurnID); err != nil {
			return f.failed(ctx, fmt.Errorf("reading the record of the turn: %w", err))
		}
	}
	results := map[string]string{}
	for _, e := range f.events {
		if d, ok := e.Data.(*event.ToolFinished); ok {
			results[d.CallID] = d.Result
		}
	}
	share := func(callID string, s *string) {
		if r, ok := results[callID]; ok && r == *s {
			*s = r
		}
	}
	for i := range rec.ToolCalls {
		r, ok := results[rec.ToolCalls[i].CallID]
		if !ok {
			whole, err := f.r.store.Turn(ctx, f.in.TurnID)
			if err != nil {
				return f.failed(ctx, fmt.Errorf("reading the record of the turn: %w", err))
			}
			rec = whole
			for i := range rec.ToolCalls {
				share(rec.ToolCalls[i].CallID, &rec.ToolCalls[i].Result)
			}
			break
		}
		rec.ToolCalls[i].Result = r
	}
	rec.Events = f.events
	res := &agent.Result{Record: rec}
	// An unreadable message is left out, and so is the rest when the
	// store cannot be read: the record says how the turn ended.
	_ = f.r.payloads.PayloadRange(ctx, f.in.TurnID, keyMessage, func(_ string, data []byte) error {
		var m model.Message
		if json.Unmarshal(data, &m) == nil {
			if m.Role == model.RoleTool {
				share(m.ToolCallID, &m.Content)
			}
			res.Messages = append(res.Messages, m)
		}
		return nil
	})
	return res
}

// end ends the turn in the store — reason, and why saying what happened —
// unless a unit ended it first, and returns it with every event followed.
func (f *follow) end(ctx context.Context, reason budget.StopReason, why string) *agent.Result {
	return f.endAs(ctx, store.End{Reason: reason, Why: why})
}

// endAs is end, ending the turn as e says.
func (f *follow) endAs(ctx context.Context, e store.End) *agent.Result {
	ending, err := f.r.ends.InterruptTurn(ctx, f.in.TurnID, e)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return f.failed(ctx, fmt.Errorf("%s, and its end could not be stored: %w", e.Why, err))
	}
	f.own, f.ending = ending != nil, ending
	f.readToEnd(ctx)
	return f.result(ctx)
}

// failed returns the result of a turn whose end could not be stored.
func (f *follow) failed(ctx context.Context, err error) *agent.Result {
	f.own = true
	now := time.Now()
	rec := &event.Turn{TurnID: f.in.TurnID, SessionID: f.in.SessionID, Agent: f.r.agent.Name(), Input: f.in.Text,
		StartedAt: f.started, EndedAt: now, WallMS: now.Sub(f.started).Milliseconds(), Status: budget.StatusInterrupted,
		StopReason: budget.Interrupted, Message: fmt.Sprintf("Interrupted: %v. Send the message again.", err), Events: f.events}
	return &agent.Result{Record: rec}
}

// workflowTaskTimeout is how long a worker has to run a turn's workflow
// task: how long a worker that dies during a model step (a local
// activity, which the worker keeps its workflow task open for) keeps the
// turn waiting before another takes it.
const workflowTaskTimeout = 5 * time.Second

// CancelWait is how long Run waits, after its context was cancelled, for a
// worker to end the turn before it terminates the workflow and returns:
// without a worker a turn would never end.
var CancelWait = 30 * time.Second

// unworked terminates the workflow of turn id, cancelled waited ago and
// still not ended by any worker (of task queue queue), so that no worker
// starts it later, and returns its end. Who ends it knows that nothing of
// the turn runs: it ran until now, and its message says how long
// (store.End.Said), not the "at least" of a crash.
func (r *Runner) unworked(ctx context.Context, id, queue string, waited time.Duration) store.End {
	why := fmt.Sprintf("it was cancelled, and no timebox worker ended it within %s", budget.Round(waited))
	r.terminate(ctx, id, why)
	none := fmt.Sprintf("none ran on task queue %s, or none reached the store", queue)
	return store.End{Reason: budget.Interrupted, Why: fmt.Sprintf("%s (%s), so its workflow was terminated", why, none),
		Said: func(ran time.Duration) string {
			return fmt.Sprintf("Cancelled after %s: no timebox worker ended it within %s of the cancel (%s), so its workflow was terminated.",
				budget.RoundHuman(ran), budget.RoundHuman(waited), none)
		}}
}

// terminate terminates the workflow of turn id, for why, so that no
// worker starts it later: the turn is ended in the store by whoever
// terminates it.
func (r *Runner) terminate(ctx context.Context, id, why string) {
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = r.client.TerminateWorkflow(tctx, WorkflowID(id), "", why)
}

// CancelTurn tells the workflow of turn turnID, which this runner does
// not follow (a gateway's cancel of a turn another, perhaps gone, started),
// that it is cancelled, for ce: the store's cancel request reaches the
// workflow through the workers otherwise, and a turn no worker runs has
// none (server.EngineCanceller).
func (r *Runner) CancelTurn(ctx context.Context, turnID string, ce *budget.CancelError) {
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = r.client.SignalWorkflow(sctx, WorkflowID(turnID), "", SignalCancel, ce)
}

// EndUnworked ends turn turnID, cancelled waited ago and still running,
// when no worker will end it: its workflow runs, and no worker has polled
// its task queue for workflow tasks within livePoll. It terminates the
// workflow, so that no worker starts it later, ends the turn in the store
// (interrupted, saying so) and reports true. With a worker about, or no
// workflow of the turn's (a turn of the embedded engine), it does
// nothing (server.EngineCanceller).
func (r *Runner) EndUnworked(ctx context.Context, turnID string, waited time.Duration) (bool, error) {
	dctx, cancel := context.WithTimeout(ctx, EngineCheck)
	defer cancel()
	d, err := r.client.DescribeWorkflowExecution(dctx, WorkflowID(turnID), "")
	switch {
	case isGone(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("asking Temporal for the workflow of turn %s: %w", turnID, err)
	case d.GetWorkflowExecutionInfo().GetStatus() != enums.WORKFLOW_EXECUTION_STATUS_RUNNING:
		return false, nil
	}
	queue := cmp.Or(d.GetWorkflowExecutionInfo().GetTaskQueue(), r.taskQueue)
	q, err := r.client.DescribeTaskQueue(dctx, queue, enums.TASK_QUEUE_TYPE_WORKFLOW)
	if err != nil {
		return false, fmt.Errorf("asking Temporal for the workers of task queue %s: %w", queue, err)
	}
	for _, p := range q.GetPollers() {
		if time.Since(p.GetLastAccessTime().AsTime()) < livePoll {
			return false, nil
		}
	}
	end := r.unworked(ctx, turnID, queue, waited)
	if _, err := r.ends.InterruptTurn(ctx, turnID, end); err != nil && !errors.Is(err, store.ErrNotFound) {
		return false, fmt.Errorf("%s, and its end could not be stored: %w", end.Why, err)
	}
	return true, nil
}

// livePoll is how recently a worker must have polled a task queue to be
// taken for running (EndUnworked): a worker's poll waits up to a minute
// for a task.
const livePoll = 90 * time.Second

// SignalApproval wakes the call of turn turnID waiting for a person's
// decision: the decision is in the store already (server.ApprovalSignaler).
func (r *Runner) SignalApproval(ctx context.Context, turnID, callID string) error {
	return r.client.SignalWorkflow(ctx, WorkflowID(turnID), "", SignalApproval+":"+callID, nil)
}

// cancel asks the turn's workflow to stop for cause: a signal carrying it,
// and a cancel request in the store for the units running now.
func (r *Runner) cancel(ctx context.Context, turnID string, cause error) {
	ce, ok := budget.AsCancel(cause)
	if !ok {
		ce = &budget.CancelError{Reason: budget.Cancelled, By: "the caller"}
		if te, ok := budget.AsTimeout(cause); ok {
			ce.By = budget.CallersDeadline + " (" + te.Error() + ")"
		}
	}
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_ = r.client.SignalWorkflow(sctx, WorkflowID(turnID), "", SignalCancel, ce)
	if err := r.store.RequestCancel(sctx, turnID); err != nil && !errors.Is(err, store.ErrNotRunning) {
		_ = err // the signal carries it; the store only makes it sooner
	}
}
