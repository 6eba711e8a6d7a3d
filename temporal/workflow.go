package temporal

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"go.temporal.io/api/enums/v1"
	sdktemporal "go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
)

// turnWorkflow is a turn as a Temporal workflow. It keeps the turn's
// machine.State and drives it with machine.Drive — the loop and the
// decisions of the embedded engine — running each unit of work as an
// activity: Advance, a local activity, for the model steps (and the
// beginning, compactions, and the end a step decides), Call for each tool
// call, and local activities for the quick ones (RefuseCalls, Lost,
// Recover, End). The stops that reach a turn from outside its units are
// the workflow's: the turn's ceiling (a timer), a cancel signal, the
// workflow's cancellation. Each unit enforces the turn's budgets itself as
// well, so a turn stopped by them ends as on the embedded engine; the
// workflow's own timer is what stops a turn whose worker can no longer.
//
// A change of what the workflow does — its commands (activities, local
// activities, timers), their order, the decisions between them — breaks
// the turns running when it is deployed. TestReplay replays the histories
// recorded in testdata/replay with the workflow as it is: every change
// from the one that recorded them on goes behind workflow.GetVersion, and
// adds recordings of its own.
type turnWorkflow struct {
	units     machine.Units
	heartbeat time.Duration
}

// slack is what an activity's StartToClose adds to the time its own
// budgets give it, so that they, not Temporal, end it.
const slack = 10 * time.Second

// maxHistory is the workflow history length past which a turn continues
// as new (between two units), whatever the server suggests: a 1,000-step
// turn never nears Temporal's history limits.
var maxHistory = 4000

// thinkLosses is how many times a model step lost with its worker is asked
// again before the turn stops.
const thinkLosses = 3

// run is the workflow function. s is the turn's state: as its runner
// began it, or as the run before this one left it (continue-as-new).
func (w *turnWorkflow) run(ctx workflow.Context, s machine.State) (*Outcome, error) {
	r := &turnRun{w: w, s: &s, root: ctx, signals: workflow.GetSignalChannel(ctx, SignalCancel), ceiling: s.Ceiling(),
		rearm: workflow.NewBufferedChannel(ctx, 1), called: workflow.NewBufferedChannel(ctx, 1)}
	r.work, r.cancelWork = workflow.WithCancel(ctx)
	r.halted, r.halt = workflow.WithCancel(ctx)
	workflow.Go(ctx, r.watch)
	d := &driver{r: r, ctx: r.work}
	end := machine.Drive(d, r.s)
	// Every return drains the signals no one will read (drain).
	defer r.drain()
	switch {
	case r.ended != nil:
		return r.ended, nil
	case end.Kind == 0:
		return nil, workflow.NewContinueAsNewError(ctx, WorkflowName, *r.s)
	}
	return r.end(*end.End)
}

// drain takes the signals the run has not read, as it ends: a cancel
// signal after the first (the runner's, and each worker's relay of the
// store's request: watch reads one), one that came as the turn ended, a
// decision's wake-up for a call whose wait had ended. None matters once
// the run ends — a cancel not yet read before a continue-as-new was taken
// by continueAsNew, a decision is in the store — and Temporal's SDK warns
// of each left unread ("Workflow has unhandled signals") on the worker.
// Reading them takes no command: replay-safe.
func (r *turnRun) drain() {
	for _, name := range workflow.GetUnhandledSignalNames(r.root) {
		ch := workflow.GetSignalChannel(r.root, name)
		for ch.ReceiveAsync(nil) {
		}
	}
}

// turnRun is one run of the workflow.
type turnRun struct {
	w    *turnWorkflow
	s    *machine.State
	root workflow.Context
	// work is the context of the units of work; cancelWork cancels them
	// (Temporal delivers it with their next heartbeat; the store's cancel
	// request and their own budgets reach them sooner).
	work       workflow.Context
	cancelWork workflow.CancelFunc
	signals    workflow.ReceiveChannel
	// stopped is what stopped the turn from outside its units, first
	// come: the ceiling, a cancel signal, the workflow's cancellation;
	// stoppedAt is when: the instant the ceiling fell (its timer may be
	// seen later, when no worker ran the workflow), or when the workflow
	// saw the signal or its cancellation.
	stopped   *machine.Cause
	stoppedAt time.Time
	// halted is done once stopped is set: a wait for people ends then at
	// once, while units get the grace of a cancel signal (halt cancels
	// it).
	halted workflow.Context
	halt   workflow.CancelFunc
	// ended is how the turn ended, when a unit ended it.
	ended *Outcome
	// losses counts the model steps lost in a row.
	losses int
	// seq numbers the units, for their keys.
	seq int
	// calling counts the calls of the batch under way whose activity
	// runs; called tells the batch's beat of one that starts (beat).
	// beating is set while the workflow keeps the batch's beat.
	calling int
	called  workflow.Channel
	beating bool
	// ceiling is when the turn's ceiling falls: its start plus
	// timeouts.turn plus its waits for nothing but people; paused while it
	// waits for them (Paused). rearm tells watch of a change.
	ceiling time.Time
	paused  bool
	rearm   workflow.Channel
}

// watch waits for the turn's ceiling, a cancel signal or the workflow's
// cancellation, whichever comes first, and stops the turn's work. A cancel
// signal reaches the running units through the store too (its runner
// stores a cancel request with it, which the units watch), so they stop
// their tools and report how themselves; only those that have not within
// the turn's kill grace and cancelGrace more — a dead worker's, one not
// yet started — are cancelled through Temporal.
func (r *turnRun) watch(ctx workflow.Context) {
	graceful := false
	for {
		// The ceiling's timer; set anew when a wait for people moved it
		// (only then is one cancelled: a workflow's histories replay
		// the same commands).
		tctx, cancelTimer := workflow.WithCancel(ctx)
		sel := workflow.NewSelector(ctx)
		if !r.paused {
			timer := workflow.NewTimer(tctx, max(r.ceiling.Sub(workflow.Now(ctx)), time.Millisecond))
			sel.AddFuture(timer, func(f workflow.Future) {
				if f.Get(ctx, nil) == nil {
					waited := r.ceiling.Sub(r.s.Start) - r.s.Budgets.Turn.D
					r.stop(&machine.Cause{Timeout: r.s.Budgets.Turn.Expired(budget.PhaseTurn, "the turn", workflow.Now(ctx).Sub(r.s.Start)-waited)}, r.ceiling)
				}
			})
		}
		rearm := false
		sel.AddReceive(r.rearm, func(c workflow.ReceiveChannel, _ bool) {
			c.Receive(ctx, nil)
			rearm = true
		})
		sel.AddReceive(r.signals, func(c workflow.ReceiveChannel, _ bool) {
			var ce budget.CancelError
			c.Receive(ctx, &ce)
			graceful = r.note(cancelCause(&ce), workflow.Now(ctx))
		})
		sel.AddReceive(ctx.Done(), func(workflow.ReceiveChannel, bool) {
			r.stop(&machine.Cause{Cancel: &budget.CancelError{Reason: budget.Cancelled, By: "Temporal (the workflow was cancelled)"}}, workflow.Now(ctx))
		})
		sel.Select(ctx)
		if !rearm {
			break
		}
		cancelTimer()
	}
	if !graceful {
		return
	}
	grace := workflow.NewTimer(ctx, r.s.Budgets.KillGrace.D+cancelGrace)
	sel := workflow.NewSelector(ctx)
	sel.AddFuture(grace, func(workflow.Future) { r.cancelWork() })
	sel.AddReceive(ctx.Done(), func(workflow.ReceiveChannel, bool) { r.cancelWork() })
	sel.Select(ctx)
}

// cancelGrace is what a cancel signal's units get past the turn's kill
// grace to stop by themselves before Temporal cancels them.
const cancelGrace = 2 * time.Second

func cancelCause(ce *budget.CancelError) *machine.Cause {
	if ce.Reason == "" {
		ce.Reason = budget.Cancelled
	}
	return &machine.Cause{Cancel: ce}
}

// stop notes c as what stopped the turn at at, first come, and cancels
// the turn's work at once.
func (r *turnRun) stop(c *machine.Cause, at time.Time) {
	if r.note(c, at) {
		r.cancelWork()
	}
}

// note notes c as what stopped the turn at at, if nothing did before;
// it reports whether it did.
func (r *turnRun) note(c *machine.Cause, at time.Time) bool {
	if r.stopped != nil {
		return false
	}
	r.stopped, r.stoppedAt = c, at
	r.halt()
	return true
}

// continueAsNew reports whether the turn goes on in a new run: its history
// is long, and nothing stopped it (a cancel signal not yet seen is taken
// now: a run must not end with one unread).
func (r *turnRun) continueAsNew() bool {
	info := workflow.GetInfo(r.root)
	if r.stopped != nil || r.seq == 0 || (!info.GetContinueAsNewSuggested() && info.GetCurrentHistoryLength() < maxHistory) {
		return false // a run does at least one unit
	}
	var ce budget.CancelError
	if r.signals.ReceiveAsync(&ce) {
		r.stop(cancelCause(&ce), workflow.Now(r.root))
		return false
	}
	return true
}

// key names a unit in the store (keyDone): the run and the unit's number.
func (r *turnRun) key(kind string) string {
	r.seq++
	return workflow.GetInfo(r.root).WorkflowExecution.RunID + "/" + kind + "-" + strconv.Itoa(r.seq)
}

// driver runs the turn's units as activities, for machine.Drive; ctx is
// the context of the coroutine it runs on (the calls of a batch run on
// coroutines of their own).
type driver struct {
	r   *turnRun
	ctx workflow.Context
}

// Now returns the workflow's clock (machine.Driver).
func (d *driver) Now() time.Time { return workflow.Now(d.ctx) }

// Check notes in s a stop the workflow knows of, and returns false when
// the turn is to go on in a new run (continue-as-new) (machine.Driver).
func (d *driver) Check(s *machine.State) bool {
	if d.r.stopped != nil && !s.Finished {
		// The workflow knows more of a stop than a unit: who cancelled.
		s.Stop = d.r.stopped
	}
	return s.Finished || !d.r.continueAsNew()
}

// Run runs the model steps (and what comes with them) in an Advance local
// activity: on the worker that runs the workflow, with no round trip
// through the server — a model step has no effect outside the turn, so a
// worker lost during one costs only asking it again. One lost with its
// worker (the workflow task times out, and another worker runs it again)
// finds what its attempts left in the store and records them
// (activities.catchUp); one that fails is asked again, up to thinkLosses
// times in a row.
func (d *driver) Run(s *machine.State, u machine.Unit) {
	r := d.r
	key := r.key("advance")
	var out advanced
	ctx := workflow.WithLocalActivityOptions(d.ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: r.untilCeiling(d.ctx) + slack,
		RetryPolicy:         &sdktemporal.RetryPolicy{MaximumAttempts: 1},
	})
	err := workflow.ExecuteLocalActivity(ctx, actAdvance, &unitIn{State: *s, Key: key}).Get(d.ctx, &out)
	if handedOver(err) {
		// Its worker is stopping, and gave the step up: the workflow task
		// fails (a panic is how a workflow fails its task), and the
		// server gives the next one to another worker at once — nothing
		// of this one is kept, and that worker runs the step again. Left
		// to time out, the task would hold the turn for 5s.
		panic(errHandOver)
	}
	if err != nil && r.recover(d.ctx, s, key, &out) {
		err = nil
	}
	if err == nil {
		*s = out.State
		r.ended = out.Ended
		r.losses = 0
		return
	}
	if r.stopped != nil {
		return // Check notes the stop; the unit's tools were stopped with it
	}
	if r.losses++; r.losses >= thinkLosses {
		s.End = &machine.Ending{Reason: budget.Interrupted, Cause: &machine.Cause{Text: fmt.Sprintf(
			"the model step could not be run: %s, %d times in a row", lostWhy(err), r.losses)}}
	}
}

// handedOver reports whether err is a model step's given up by its
// worker's stop (errHandOver).
func handedOver(err error) bool {
	var ae *sdktemporal.ApplicationError
	return errors.As(err, &ae) && ae.Type() == typeHandOver
}

// Call runs one tool call as an activity. A call whose activity failed —
// its worker died or stopped heartbeating, and any retries the tool
// declared failed too — is recorded as lost (its own record is used when
// it reached the store), never run again silently.
func (d *driver) Call(s *machine.State, step int, c machine.Call) machine.Called {
	r := d.r
	attempts := int32(1)
	limit := r.untilCeiling(d.ctx)
	if tb, retries, ok := r.w.units.ToolBudget(s, c.Name); ok {
		attempts += int32(retries)
		if tb.Enforcement != budget.Advisory && tb.Timeout.D > 0 {
			// A hard or cooperative call ends at its timeout plus its
			// kill grace (the activity enforces both itself).
			limit = min(limit, tb.Timeout.D+tb.KillGrace.D)
		}
	}
	key := r.key("call")
	in := &unitIn{State: *s, Key: key, Step: step, Call: c, Beaten: r.beating}
	// A call needs none of its batch's calls (the step's message has
	// them): a reply of 10,000 would put them in every call's input, in
	// the workflow's history — 300 KB each.
	in.State.Batch = nil
	var out machine.Called
	started := workflow.Now(d.ctx)
	if r.beating {
		r.calling++
		r.called.SendAsync(struct{}{})
	}
	err := workflow.ExecuteActivity(r.options(d.ctx, limit, attempts, key), actCall, in).Get(d.ctx, &out)
	if r.beating {
		r.calling--
	}
	if err == nil || r.recover(d.ctx, s, key, &out) {
		return out
	}
	// The turn stopped (its ceiling, a cancel) while the call ran on a
	// worker that is gone: the call says what ran, as its unit would have
	// (for the turn's message, and its flag timed_out_during_tool_execution),
	// for as long as it ran when the turn stopped — not until the loss was
	// seen, a heartbeat timeout and a workflow task later.
	var stopped *machine.StopNote
	if r.stopped != nil {
		stopped = &machine.StopNote{Desc: machine.RunningDesc(c.Name, max(r.stoppedAt.Sub(started), 0)), Tools: []string{c.Name}, DuringRun: true}
	}
	lost := *in
	lost.Why, lost.Noticed = lostWhy(err), workflow.Now(d.ctx)
	var te *sdktemporal.TimeoutError
	if errors.As(err, &te) && te.HasLastHeartbeatDetails() {
		var b beat
		if te.LastHeartbeatDetails(&b) == nil {
			lost.Beat = &b
			if rest, ok := strings.CutPrefix(lost.Why, "its worker "); ok && b.Worker != "" {
				lost.Why = "its worker (" + b.Worker + ") " + rest
			}
		}
	}
	if err := r.local(d.ctx, actLost, &lost, &out); err != nil {
		// Not even a record could be written: the turn goes on, and its
		// end says what is missing.
		s.Stop = &machine.Cause{Text: "the record of a lost call could not be written: " + err.Error()}
	}
	if out.Stopped == nil {
		out.Stopped = stopped
	}
	return out
}

// Refuse records calls that are not run in local activities: up to
// refuseShare calls in each (RefuseCalls), however many the model asked
// for past max_tool_calls. Workflows recorded before (no refuseBatch
// marker) ran one local activity a call (Refuse), and replay so.
func (d *driver) Refuse(s *machine.State, step int, cs []machine.Call, reason string) []machine.Called {
	out := make([]machine.Called, len(cs))
	if workflow.GetVersion(d.ctx, refuseBatch, workflow.DefaultVersion, 1) == workflow.DefaultVersion {
		for i, c := range cs {
			_ = d.r.local(d.ctx, actRefuse, &unitIn{State: *s, Step: step, Call: c, Reason: reason}, &out[i])
		}
		return out
	}
	for i := 0; i < len(cs); i += refuseShare {
		share := cs[i:min(len(cs), i+refuseShare)]
		var got []machine.Called
		if d.r.local(d.ctx, actRefuses, &unitIn{State: *s, Step: step, Calls: share, Reason: reason}, &got) == nil {
			copy(out[i:], got[:min(len(got), len(share))])
		}
	}
	return out
}

// refuseBatch is the change of Refuse to a local activity for many
// calls (workflow.GetVersion).
const refuseBatch = "refuse-batch"

// haltWaits is the change of a wait for people to end at a cancel
// signal's stop at once (workflow.GetVersion).
const haltWaits = "halt-waits"

// refuseShare is how many calls one RefuseCalls refuses: its local
// activity writes their records and messages well within its
// StartToClose, and its result (a Called each, in the workflow's history)
// stays far below Temporal's payload limits.
const refuseShare = 1000

// Group returns a group that runs a batch's calls on workflow coroutines,
// at most slots at once, keeping the batch's beat of still_working
// notices (machine.Driver).
func (d *driver) Group(slots int) machine.Group {
	g := &group{d: d, sem: workflow.NewSemaphore(d.ctx, int64(slots)), wg: workflow.NewWaitGroup(d.ctx)}
	r := d.r
	if r.s.Budgets.ProgressNotice.D > 0 && workflow.GetVersion(d.ctx, batchBeat, workflow.DefaultVersion, 1) >= 1 {
		var bctx workflow.Context
		bctx, g.unbeat = workflow.WithCancel(d.ctx)
		r.beating, r.calling = true, 0
		r.called.ReceiveAsync(nil)
		workflow.Go(bctx, func(ctx workflow.Context) { r.beat(ctx, r.s.Steps) })
	}
	return g
}

// batchBeat is the change of a batch's still_working notices from one a
// call (each call's activity kept a beat of its own) to one a beat of
// the batch, naming its silent calls, as the embedded engine sends them
// (workflow.GetVersion).
const batchBeat = "batch-beat"

// beat keeps the beat of the batch of step while its calls run, as the
// embedded engine's turn does (docs/decisions/quieter-notices.md): the
// first progress_notice after a call starts when none ran, then every
// interval while any runs; each beat runs Notice, which sends one
// still_working naming the calls that were silent, or none. While no
// call's activity runs (the calls wait for people, or for a slot) it
// keeps no timer.
func (r *turnRun) beat(ctx workflow.Context, step int) {
	notice := r.s.Budgets.ProgressNotice.D
	for {
		if r.calling == 0 {
			sel := workflow.NewSelector(ctx)
			sel.AddReceive(r.called, func(c workflow.ReceiveChannel, _ bool) { c.Receive(ctx, nil) })
			sel.AddReceive(ctx.Done(), func(workflow.ReceiveChannel, bool) {})
			sel.Select(ctx)
			if ctx.Err() != nil {
				return
			}
		}
		for r.calling > 0 {
			if workflow.NewTimer(ctx, notice).Get(ctx, nil) != nil {
				return // the batch ended
			}
			if r.calling == 0 || r.stopped != nil {
				break
			}
			lctx := workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
				StartToCloseTimeout: 30 * time.Second,
				RetryPolicy:         &sdktemporal.RetryPolicy{MaximumAttempts: 1},
			})
			// A notice that could not be sent is no loss worth a retry:
			// the next beat sends what is silent then.
			st := *r.s
			st.Batch = nil
			_ = workflow.ExecuteLocalActivity(lctx, actNotice, &unitIn{State: st, Step: step}).Get(ctx, nil)
		}
		r.called.ReceiveAsync(nil)
	}
}

// group runs the calls of a batch on workflow coroutines.
type group struct {
	d   *driver
	sem workflow.Semaphore
	wg  workflow.WaitGroup
	// unbeat ends the batch's beat, if the workflow keeps one.
	unbeat workflow.CancelFunc
}

// Acquire waits for a free slot; it returns false when the workflow's
// context ended first.
func (g *group) Acquire() bool { return g.sem.Acquire(g.d.ctx, 1) == nil }

// Release frees a slot.
func (g *group) Release() { g.sem.Release(1) }

// Wait waits for every call of the batch, then ends the batch's beat.
func (g *group) Wait() {
	g.wg.Wait(g.d.ctx)
	if g.unbeat != nil {
		g.unbeat()
		g.d.r.beating = false
	}
}

// Go runs f on a workflow coroutine, with a driver of its own.
func (g *group) Go(f func(machine.Driver)) {
	g.wg.Add(1)
	workflow.Go(g.d.ctx, func(ctx workflow.Context) {
		defer g.wg.Done()
		f(&driver{r: g.d.r, ctx: ctx})
	})
}

// recover reads the result a unit stored before its report to Temporal
// was lost, into out; it reports whether there was one.
func (r *turnRun) recover(ctx workflow.Context, s *machine.State, key string, out any) bool {
	var rec recovered
	if err := r.local(ctx, actRecover, &unitIn{State: *s, Key: key}, &rec); err != nil || !rec.Found {
		return false
	}
	return json.Unmarshal(rec.Result, out) == nil
}

// end ends the turn as e says, as a local activity that outlives the
// workflow's cancellation.
func (r *turnRun) end(e machine.Ending) (*Outcome, error) {
	var out Outcome
	if err := r.local(r.root, actEnd, &unitIn{State: *r.s, End: &e}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// local runs a quick unit as a local activity, on a context the turn's
// stop does not cancel.
func (r *turnRun) local(ctx workflow.Context, name string, in *unitIn, out any) error {
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	dctx = workflow.WithLocalActivityOptions(dctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy:         &sdktemporal.RetryPolicy{MaximumAttempts: 3, InitialInterval: 200 * time.Millisecond},
	})
	return workflow.ExecuteLocalActivity(dctx, name, in).Get(dctx, out)
}

// untilCeiling is the time left before the turn's ceiling.
func (r *turnRun) untilCeiling(ctx workflow.Context) time.Duration {
	return max(r.ceiling.Sub(workflow.Now(ctx)), 0)
}

// options returns ctx with the options of a unit of work that its own
// budgets end within limit: StartToClose is limit plus slack, the
// heartbeat timeout is the worker heartbeat, and Temporal tries it at most
// attempts times — again only when its worker was lost (a unit's failures
// of its own are results, not errors).
func (r *turnRun) options(ctx workflow.Context, limit time.Duration, attempts int32, key string) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		ActivityID:          key,
		StartToCloseTimeout: limit + slack,
		HeartbeatTimeout:    r.w.heartbeat,
		WaitForCancellation: true,
		RetryPolicy:         &sdktemporal.RetryPolicy{MaximumAttempts: attempts, InitialInterval: 100 * time.Millisecond},
	})
}

// lostWhy says why an activity failed, for the record of a lost unit:
// its worker stopped heartbeating, or the error it failed with.
func lostWhy(err error) string {
	var ae *sdktemporal.ActivityError
	worker := "its worker"
	if errors.As(err, &ae) && ae.Identity() != "" {
		worker = "worker " + ae.Identity()
	}
	var te *sdktemporal.TimeoutError
	if errors.As(err, &te) {
		switch te.TimeoutType() {
		case enums.TIMEOUT_TYPE_HEARTBEAT:
			return worker + " stopped sending heartbeats (it died or lost its connection)"
		case enums.TIMEOUT_TYPE_START_TO_CLOSE:
			return worker + " did not finish it in time"
		}
	}
	var ce *sdktemporal.CanceledError
	if errors.As(err, &ce) {
		return "it was cancelled before " + worker + " reported"
	}
	var app *sdktemporal.ApplicationError
	if errors.As(err, &app) && app.Type() == "engine" {
		// In words: Error() adds the SDK's "(type: …, retryable: …)" and
		// the cause's.
		return "it was given up by " + app.Message() + " (" + worker + ")"
	}
	return fmt.Sprintf("%s failed: %v", worker, errors.Unwrap(err))
}

// Asks reports whether call c's tool may need a person's decision
// (machine.Driver).
func (d *driver) Asks(_ *machine.State, c machine.Call) bool { return d.r.w.units.AsksApproval(c.Name) }

// Approve has a call wait for a person's decision in the workflow: a
// local activity asks (stores the request, approval_requested), then the
// call waits for a signal (SignalApproval:call_id, sent by whoever stored
// a decision), its expiry (a timer) or the turn's stop, and a local
// activity ends the wait with the decision the store holds
// (approval_decided; the record of a call that does not run).
func (d *driver) Approve(s *machine.State, step int, c machine.Call) (bool, machine.Called) {
	r := d.r
	sig := workflow.GetSignalChannel(r.root, SignalApproval+":"+machine.CallID(step, c.Index))
	var began time.Time
	var waiting *machine.StopNote // the wait a stop ended
	for round := 1; ; round++ {
		var ask asked
		if err := r.local(d.ctx, actAsk, &unitIn{State: *s, Step: step, Call: c, Round: round, Began: began}, &ask); err != nil {
			ask.Asked = machine.Asked{Needed: true, CallID: machine.CallID(step, c.Index), Tool: c.Name, Round: round, Began: began}
			ask.Decision = &machine.Decision{Decision: event.Deny, By: "timebox", Reason: "the request for a decision could not be made: " + lostWhy(err)}
		}
		if !ask.Asked.Needed {
			return true, machine.Called{}
		}
		began = ask.Asked.Began
		in := &unitIn{State: *s, Step: step, Call: c, Asked: &ask.Asked, Decision: ask.Decision}
		var out decided
		for {
			if in.Decision == nil {
				d.wait(sig, ask.Asked.ExpiresAt, in)
				if in.Stopped && waiting == nil {
					// What the turn was doing when it was stopped, for its
					// message, as the embedded engine says it.
					waiting = &machine.StopNote{Desc: machine.WaitingDesc(c.Name, workflow.Now(d.ctx).Sub(ask.Asked.Began))}
				}
			}
			if err := r.local(d.ctx, actDecided, in, &out); err != nil {
				in.Decision = &machine.Decision{Decision: event.Deny, By: "timebox", Reason: "the decision could not be read: " + lostWhy(err)}
				continue
			}
			if !out.Waits {
				break
			}
		}
		if !out.Again {
			out.Out.Stopped = out.Out.Stopped.Merge(waiting)
			return out.Run, out.Out
		}
	}
}

// wait waits for a signal that a decision was stored, the wait's expiry at
// expires, or the turn's stop, and notes which in in.
func (d *driver) wait(sig workflow.ReceiveChannel, expires time.Time, in *unitIn) {
	// A stop (a cancel signal too, whose units get a grace to stop by
	// themselves) ends a wait for people at once: it has nothing to wind
	// down. Waits recorded before did not see a signal's stop until the
	// grace was over, and replay so.
	halted := workflow.GetVersion(d.ctx, haltWaits, workflow.DefaultVersion, 1) >= 1
	if d.ctx.Err() != nil || (halted && d.r.stopped != nil) {
		in.Stopped = true
		return
	}
	tctx, cancel := workflow.WithCancel(d.ctx)
	timer := workflow.NewTimer(tctx, max(expires.Sub(workflow.Now(d.ctx)), time.Millisecond))
	sel := workflow.NewSelector(d.ctx)
	sel.AddReceive(sig, func(c workflow.ReceiveChannel, _ bool) { c.Receive(d.ctx, nil) })
	sel.AddFuture(timer, func(f workflow.Future) { in.Expired = f.Get(d.ctx, nil) == nil })
	sel.AddReceive(d.ctx.Done(), func(workflow.ReceiveChannel, bool) { in.Stopped = true })
	if halted {
		sel.AddReceive(d.r.halted.Done(), func(workflow.ReceiveChannel, bool) { in.Stopped = true })
	}
	sel.Select(d.ctx)
	if !in.Expired {
		cancel()
	}
}

// Paused moves the turn's ceiling: stopped while the turn waits for
// nothing but people, and where the wait moved it once it works again
// (the watch coroutine sets its timer anew).
func (d *driver) Paused(paused bool, at time.Time) {
	r := d.r
	r.paused = paused
	if !paused {
		r.ceiling = at
	}
	r.rearm.SendAsync(struct{}{})
}
