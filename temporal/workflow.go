package temporal

import (
	"errors"
	"fmt"
	"time"

	"go.temporal.io/api/enums/v1"
	sdktemporal "go.temporal.io/sdk/temporal"
	"go.temporal.io/sdk/workflow"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/model"
)

// turnWorkflow is a turn as a Temporal workflow. It keeps the turn's state
// (agent.State) between units of work, and decides only what needs no
// clock and no I/O: which unit runs next, max_tool_calls, and the
// turn-level stops that reach it from outside a unit — the turn's ceiling
// (a workflow timer), a cancel signal, the workflow's cancellation. Each
// unit enforces the turn's budgets itself as well, so a turn stopped by
// them ends with the same turn_finished, message and flags as on the
// embedded engine; the workflow's own timer is what stops a turn whose
// worker can no longer.
type turnWorkflow struct {
	agent     *agent.Agent
	heartbeat time.Duration
}

// slack is what an activity's StartToClose adds to the time its own
// budgets give it, so that they, not Temporal, end it.
const slack = 10 * time.Second

// run is the workflow function.
func (w *turnWorkflow) run(ctx workflow.Context, in agent.Input) (*Outcome, error) {
	var s agent.State
	if err := workflow.ExecuteLocalActivity(local(ctx), actBegin, in).Get(ctx, &s); err != nil {
		return nil, err
	}
	tw := &turnRun{w: w, s: &s}
	tw.work, tw.cancelWork = workflow.WithCancel(ctx)
	workflow.Go(ctx, tw.watch)
	return tw.loop(ctx)
}

// turnRun is one run of the workflow.
type turnRun struct {
	w *turnWorkflow
	s *agent.State
	// work is the context of the units of work; cancelWork cancels them
	// (Temporal delivers it with their next heartbeat; the store's cancel
	// request and their own budgets reach them sooner).
	work       workflow.Context
	cancelWork workflow.CancelFunc
	// stopped is what stopped the turn from outside its units, first
	// come: the ceiling, a cancel signal, the workflow's cancellation.
	stopped *agent.Cause
}

// watch waits for the turn's ceiling, a cancel signal or the workflow's
// cancellation, whichever comes first, and stops the turn's work.
func (r *turnRun) watch(ctx workflow.Context) {
	deadline := r.s.Start.Add(r.s.Budgets.Turn.D)
	timer := workflow.NewTimer(ctx, max(deadline.Sub(workflow.Now(ctx)), time.Millisecond))
	sel := workflow.NewSelector(ctx)
	sel.AddFuture(timer, func(f workflow.Future) {
		if f.Get(ctx, nil) == nil {
			r.stop(&agent.Cause{Timeout: r.s.Budgets.Turn.Expired(budget.PhaseTurn, "the turn", workflow.Now(ctx).Sub(r.s.Start))})
		}
	})
	sel.AddReceive(workflow.GetSignalChannel(ctx, SignalCancel), func(c workflow.ReceiveChannel, _ bool) {
		var ce budget.CancelError
		c.Receive(ctx, &ce)
		if ce.Reason == "" {
			ce.Reason = budget.Cancelled
		}
		r.stop(&agent.Cause{Cancel: &ce})
	})
	sel.AddReceive(ctx.Done(), func(workflow.ReceiveChannel, bool) {
		r.stop(&agent.Cause{Cancel: &budget.CancelError{Reason: budget.Cancelled, By: "Temporal (the workflow was cancelled)"}})
	})
	sel.Select(ctx)
}

func (r *turnRun) stop(c *agent.Cause) {
	if r.stopped == nil {
		r.stopped = c
		r.cancelWork()
	}
}

// loop runs the turn's steps until it ends.
func (r *turnRun) loop(ctx workflow.Context) (*Outcome, error) {
	for {
		if r.stopped != nil {
			return r.end(ctx, agent.StopReasonOf(r.stopped.Err()), r.stopped, 0)
		}
		var out thought
		err := workflow.ExecuteActivity(r.activity(r.work, r.untilCeiling(ctx), 3), actThink, r.s).Get(ctx, &out)
		if err != nil {
			if r.stopped != nil {
				continue
			}
			return r.end(ctx, budget.Interrupted, &agent.Cause{Text: "the model step could not be run: " + lostWhy(err)}, 0)
		}
		*r.s = out.State
		if out.End != nil {
			return out.End, nil
		}
		refused, cause := r.toolStep(ctx, out.Calls)
		if r.stopped == nil && cause != nil {
			r.stop(cause)
		}
		if r.stopped != nil {
			continue
		}
		if refused > 0 {
			return r.end(ctx, budget.MaxToolCalls, nil, refused)
		}
	}
}

// toolStep runs one batch of tool calls, up to parallel_tools at once,
// each an activity, and adds their results to the conversation. It
// returns how many calls max_tool_calls refused, and the cause of a
// turn-level stop that a call's unit met first.
func (r *turnRun) toolStep(ctx workflow.Context, calls []model.ToolCall) (refused int, cause *agent.Cause) {
	s := r.s
	step, start := s.Steps, workflow.Now(ctx)
	results := make([]string, len(calls))
	sem := workflow.NewSemaphore(ctx, max(1, s.Limits.ParallelTools.N))
	wg := workflow.NewWaitGroup(ctx)
	for i, c := range calls {
		callID := fmt.Sprintf("call_%d_%d", step, i+1)
		if int64(s.ToolCalls) >= s.Limits.MaxToolCalls.N {
			refused++
			results[i] = r.refuse(ctx, step, callID, c, agent.RefusedLimit)
			continue
		}
		s.ToolCalls++
		if err := sem.Acquire(r.work, 1); err != nil {
			results[i] = r.refuse(ctx, step, callID, c, agent.RefusedCancelled)
			continue
		}
		wg.Add(1)
		in := &callIn{State: r.light(), Step: step, CallID: callID, Call: c}
		workflow.Go(ctx, func(ctx workflow.Context) {
			defer wg.Done()
			defer sem.Release(1)
			out := r.call(ctx, in)
			results[i] = out.Result
			s.ToolRecords = append(s.ToolRecords, out.Record)
			s.Stopped = s.Stopped.Merge(out.Stopped)
			if cause == nil && out.Cause != nil {
				cause = out.Cause
			}
		})
	}
	wg.Wait(ctx)
	s.Heard(calls, results)
	s.ToolTime += workflow.Now(ctx).Sub(start)
	return refused, cause
}

// call runs one tool call as an activity. A call whose activity failed —
// its worker died or stopped heartbeating, and any retries the tool
// declared failed too — is recorded as lost, never run again silently.
func (r *turnRun) call(ctx workflow.Context, in *callIn) agent.Called {
	attempts := int32(1)
	limit := r.untilCeiling(ctx)
	if tb, retries, ok := r.w.agent.ToolBudget(r.s, in.Call.Name); ok {
		attempts += int32(retries)
		if tb.Enforcement != budget.Advisory && tb.Timeout.D > 0 {
			// A hard or cooperative call ends at its timeout plus its
			// kill grace (the activity enforces both itself).
			limit = min(limit, tb.Timeout.D+tb.KillGrace.D)
		}
	}
	scheduled := workflow.Now(ctx)
	var out agent.Called
	// Waited on with ctx, not the work's context: a cancelled call still
	// reports its record (WaitForCancellation).
	err := workflow.ExecuteActivity(r.activity(r.work, limit, attempts), actCall, in).Get(ctx, &out)
	if err == nil {
		return out
	}
	lost := *in
	lost.Started, lost.Why = scheduled, lostWhy(err)
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	if err := workflow.ExecuteLocalActivity(local(dctx), actLost, &lost).Get(dctx, &out); err != nil {
		// Not even a record could be written: the model is told anyway.
		out.Result = "The call was lost: " + lost.Why + "."
	}
	return out
}

// refuse records a call that is not run, as a local activity.
func (r *turnRun) refuse(ctx workflow.Context, step int, callID string, c model.ToolCall, reason string) string {
	in := &callIn{State: r.light(), Step: step, CallID: callID, Call: c, Reason: reason}
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	var out agent.Called
	if err := workflow.ExecuteLocalActivity(local(dctx), actRefuse, in).Get(dctx, &out); err != nil {
		return "Not run."
	}
	r.s.ToolRecords = append(r.s.ToolRecords, out.Record)
	return out.Result
}

// end ends the turn with reason, as a local activity that outlives the
// workflow's cancellation.
func (r *turnRun) end(ctx workflow.Context, reason budget.StopReason, cause *agent.Cause, refused int) (*Outcome, error) {
	dctx, _ := workflow.NewDisconnectedContext(ctx)
	var out Outcome
	err := workflow.ExecuteLocalActivity(local(dctx), actEnd, &endIn{State: *r.s, Reason: reason, Cause: cause, Refused: refused}).Get(dctx, &out)
	if err != nil {
		return nil, err
	}
	return &out, nil
}

// light returns the turn's state without what a tool call does not need:
// the conversation and the records, which only grow the activity's input
// in the workflow's history.
func (r *turnRun) light() agent.State {
	l := *r.s
	l.Messages, l.ToolRecords, l.ModelRecords = nil, nil, nil
	l.Input.History = nil
	return l
}

// untilCeiling is the time left before the turn's ceiling.
func (r *turnRun) untilCeiling(ctx workflow.Context) time.Duration {
	return max(r.s.Start.Add(r.s.Budgets.Turn.D).Sub(workflow.Now(ctx)), 0)
}

// activity returns ctx with the options of a unit of work that its own
// budgets end within limit: StartToClose is limit plus slack, the
// heartbeat timeout is the worker heartbeat, and Temporal tries it at most
// attempts times — again only when its worker was lost (a unit's failures
// of its own are results, not errors).
func (r *turnRun) activity(ctx workflow.Context, limit time.Duration, attempts int32) workflow.Context {
	return workflow.WithActivityOptions(ctx, workflow.ActivityOptions{
		StartToCloseTimeout: limit + slack,
		HeartbeatTimeout:    r.w.heartbeat,
		WaitForCancellation: true,
		RetryPolicy:         &sdktemporal.RetryPolicy{MaximumAttempts: attempts, InitialInterval: 100 * time.Millisecond},
	})
}

// local returns ctx with the options of the quick units: begin, refuse,
// lost, end.
func local(ctx workflow.Context) workflow.Context {
	return workflow.WithLocalActivityOptions(ctx, workflow.LocalActivityOptions{
		StartToCloseTimeout: 30 * time.Second,
		RetryPolicy:         &sdktemporal.RetryPolicy{MaximumAttempts: 3, InitialInterval: 200 * time.Millisecond},
	})
}

// lostWhy says why an activity failed, for the record of a lost call:
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
	return fmt.Sprintf("%s failed: %v", worker, errors.Unwrap(err))
}
