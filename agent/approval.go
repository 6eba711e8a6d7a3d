package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/tool"
)

// Approver decides on the calls of tools that need a person's decision
// before they run (Tool.NeedsApproval): a prompt on a terminal, the
// server's route and page, a program's own.
type Approver interface {
	// Approve waits for the decision on req and returns it. ctx ends at
	// req.ExpiresAt (then the call expires: return ctx's error, or an
	// Expired decision) or when the turn is stopped. An Approver that
	// keeps decisions elsewhere (a store) records the expiry there before
	// it returns, so that a decision made at the last moment is either
	// used or refused, never lost. Any other error denies the call, saying
	// why, and so does a panic. An Approve that has not returned within
	// budget.CancelGrace of ctx's end is abandoned: the call expires, or
	// the turn stops, without it.
	Approve(ctx context.Context, req ApprovalRequest) (Decision, error)
}

// ApprovalAsker is an Approver that records each request before the turn
// announces it (approval_requested), so that a decision that follows the
// event finds it: a store shared with those who decide. A request that
// cannot be recorded is denied, saying why.
type ApprovalAsker interface {
	Approver
	// Asked records req before approval_requested is emitted; an error
	// denies the call, saying why.
	Asked(ctx context.Context, req ApprovalRequest) error
}

// ApproverFunc is a function that is an Approver.
type ApproverFunc func(ctx context.Context, req ApprovalRequest) (Decision, error)

// Approve calls f.
func (f ApproverFunc) Approve(ctx context.Context, req ApprovalRequest) (Decision, error) {
	return f(ctx, req)
}

// ApprovalRequest is a call waiting for a person's decision: what
// approval_requested says.
type ApprovalRequest struct {
	// TurnID and SessionID name the turn and its conversation (SessionID
	// is empty for a turn outside a session).
	TurnID, SessionID string
	// Step is the turn's step the call belongs to, from 1.
	Step int
	// CallID names the call; Tool is the tool it calls.
	CallID, Tool string
	// Arguments are the call's arguments as the model sent them (JSON).
	Arguments json.RawMessage
	// RequestedAt is when the call began to wait; ExpiresAt is when it
	// stops waiting (approval_expired) without a decision.
	RequestedAt time.Time
	ExpiresAt   time.Time
	// Round counts the requests for the call, from 1: a decision that
	// could not be used at once is asked for again (ApprovalFresh).
	Round int
}

// Decision is a person's decision on a call.
type Decision struct {
	// Decision is event.Approve, event.Deny or event.Expired.
	Decision event.Decision
	// By says who decided ("alice", "the terminal", "a client of the
	// server"); Reason why, in their words.
	By, Reason string
	// At is when the decision was made; zero is when Approve returned.
	At time.Time
}

// ApprovalRequired is a Tool.NeedsApproval that asks for every call:
// `approval: required` in the agent file.
func ApprovalRequired(json.RawMessage) bool { return true }

// ApprovalFresh is how old an approval may be when the call would start:
// one made while its turn could not act on it (its process was down, the
// turn was moved) is asked for again rather than acted on late.
const ApprovalFresh = 30 * time.Second

// PendingApproval is a request handed to a program by ApprovalChannel:
// Decide answers it.
type PendingApproval struct {
	ApprovalRequest
	mu      sync.Mutex
	done    bool
	decided chan Decision // holds the one decision
}

// Decide answers the request. It reports false when the call no longer
// waits for it (it expired, its turn stopped, it was already decided).
func (p *PendingApproval) Decide(d Decision) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return false
	}
	p.done = true
	p.decided <- d
	return true
}

// end ends the wait: the decision that raced it, if one did.
func (p *PendingApproval) end() (Decision, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done {
		return <-p.decided, true
	}
	p.done = true
	return Decision{}, false
}

// ApprovalChannel returns an Approver that sends each request on ch and
// waits for the program's Decide, or for the request to expire.
func ApprovalChannel(ch chan<- *PendingApproval) Approver {
	return ApproverFunc(func(ctx context.Context, req ApprovalRequest) (Decision, error) {
		p := &PendingApproval{ApprovalRequest: req, decided: make(chan Decision, 1)}
		select {
		case ch <- p:
		case <-ctx.Done():
			return Decision{}, ctx.Err()
		}
		select {
		case d := <-p.decided:
			return d, nil
		case <-ctx.Done():
			// A decision that raced the end is used, not lost.
			if d, ok := p.end(); ok {
				return d, nil
			}
			return Decision{}, ctx.Err()
		}
	})
}

// approvalBudget is how long a call of e waits for a decision: the tool's
// approval_timeout, else the turn's timeouts.approval.
func (t *turn) approvalBudget(e *entry) budget.Duration {
	if !e.ApprovalTimeout.Unset() && !followsDefault(e.ApprovalTimeout.Source) {
		return e.ApprovalTimeout
	}
	return t.s.Budgets.Approval
}

// asks reports whether call c of the batch of view needs a person's
// decision: its tool says so for its arguments. A call that will be
// refused anyway (an unknown tool, arguments the schema refuses) is not
// put to anyone.
func (t *turn) asks(view *machine.State, c machine.Call) (needs bool) {
	e, ok := t.a.tools[c.Name]
	if !ok || e.NeedsApproval == nil {
		return false
	}
	mc := t.askedFor(view, c)
	args := arguments(mc.Arguments)
	if e.schema.Check(json.RawMessage(mc.Arguments)) != nil {
		return false
	}
	defer func() {
		if recover() != nil {
			needs = true // a deciding function that panics asks a person
		}
	}()
	return e.NeedsApproval(args)
}

// approveUnit has call c of step's batch wait for a person's decision
// (approval_requested, approval_decided) and reports whether it runs. A
// call that does not — denied, expired, its turn stopped meanwhile — is
// recorded, and the model is told. It is askUnit, the turn's Approver,
// then decidedUnit, round after round while an approval is too old to act
// on; an engine whose calls wait elsewhere runs the same two units around
// its own wait.
func (t *turn) approveUnit(ctx context.Context, view *machine.State, step int, c machine.Call) (bool, machine.Called) {
	var began time.Time
	var record func(context.Context, machine.Asked) error
	if asker, ok := t.approver.(ApprovalAsker); ok {
		record = func(ctx context.Context, a machine.Asked) error { return asker.Asked(ctx, t.approvalRequest(step, a)) }
	}
	for round := 1; ; round++ {
		var a machine.Asked
		var d *machine.Decision
		if round == 1 && c.Waited != nil {
			// Resumed: the call waits again, without asking again.
			a = *c.Waited
			if t.live != nil {
				t.live.begin(t.waiting(step, a))
			}
		} else {
			a, d = t.askUnit(ctx, view, step, c, round, began, record)
		}
		began = a.Began
		if !a.Needed {
			return true, machine.Called{}
		}
		if d == nil {
			wctx, stop := t.susp.watch(ctx)
			dec, err := t.ask(wctx, t.approvalRequest(step, a))
			stop()
			if err != nil && t.susp.suspends(ctx, wctx) {
				t.endWait(a.CallID, false)
				return false, machine.Called{Suspended: &a}
			}
			d = &machine.Decision{Decision: dec.Decision, By: dec.By, Reason: dec.Reason, At: dec.At, Stopped: err != nil}
		}
		run, again, out := t.decidedUnit(view, step, c, a, *d)
		if !again {
			return run, out
		}
	}
}

// approvalRequest is the ApprovalRequest of a.
func (t *turn) approvalRequest(step int, a machine.Asked) ApprovalRequest {
	return ApprovalRequest{TurnID: t.s.TurnID, SessionID: t.s.SessionID, Step: step, CallID: a.CallID, Tool: a.Tool,
		Arguments: a.Arguments, RequestedAt: a.RequestedAt, ExpiresAt: a.ExpiresAt, Round: a.Round}
}

// askUnit asks for a person's decision on call c, when its tool needs
// one: record keeps the request first, then approval_requested. A
// request record refuses is denied at once.
func (t *turn) askUnit(ctx context.Context, view *machine.State, step int, c machine.Call, round int, began time.Time,
	record func(context.Context, machine.Asked) error) (machine.Asked, *machine.Decision) {
	if !t.asks(view, c) {
		return machine.Asked{}, nil
	}
	mc := t.askedFor(view, c)
	limit := t.approvalBudget(t.a.tools[c.Name])
	now := time.Now()
	if began.IsZero() {
		began = now
	}
	a := machine.Asked{Needed: true, CallID: machine.CallID(step, c.Index), Tool: c.Name, Arguments: arguments(mc.Arguments),
		Round: round, RequestedAt: now, ExpiresAt: now.Add(limit.D), Began: began}
	if record != nil {
		if err := record(ctx, a); err != nil {
			return a, &machine.Decision{Decision: event.Deny, By: "timebox", Reason: "the request for a decision could not be recorded: " + err.Error(),
				Stopped: ctx.Err() != nil}
		}
	}
	ev := &event.ApprovalRequested{Step: step, CallID: a.CallID, Tool: c.Name, Arguments: a.Arguments, ExpiresAt: a.ExpiresAt.UTC(),
		TimeoutMS: limit.MS(), Source: limit.Source, Knob: limit.Knob}
	if round > 1 {
		ev.Round = round
	}
	t.em.Emit(ev)
	if t.live != nil {
		t.live.begin(t.waiting(step, a))
	}
	return a, nil
}

// waiting is the liveness activity of a call waiting for a person: the
// step watchdog does not fire while it waits, and notices do not name it.
func (t *turn) waiting(step int, a machine.Asked) *activity {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.waits == nil {
		t.waits = map[string]*activity{}
	}
	act := &activity{step: step, subject: toolSubject(a.Tool), callID: a.CallID, approvalOf: a.Tool}
	t.waits[a.CallID] = act
	return act
}

// endWait ends the liveness activity of a call's wait; a decision is
// progress.
func (t *turn) endWait(callID string, progressed bool) {
	t.mu.Lock()
	act := t.waits[callID]
	delete(t.waits, callID)
	t.mu.Unlock()
	if act != nil && t.live != nil {
		t.live.end(act, progressed)
	}
}

// decidedUnit ends the wait of a with d: approval_decided, and, for a call
// that does not run, its record and what the model is told. again: an
// approval made too long before the call could start (ApprovalFresh) is
// not acted on, and the call is to be asked again.
func (t *turn) decidedUnit(view *machine.State, step int, c machine.Call, a machine.Asked, d machine.Decision) (run, again bool, out machine.Called) {
	now := time.Now()
	t.endWait(a.CallID, !d.Stopped)
	if d.At.IsZero() || d.At.After(now) {
		d.At = now
	}
	stale := d.Decision == event.Approve && now.Sub(d.At) > ApprovalFresh
	if !d.Stopped && !a.RequestedAt.IsZero() {
		ev := &event.ApprovalDecided{CallID: a.CallID, Tool: c.Name, Decision: d.Decision, By: d.By, Reason: d.Reason,
			WaitedMS: now.Sub(a.RequestedAt).Milliseconds(), Stale: stale}
		if a.Round > 1 {
			ev.Round = a.Round
		}
		t.em.Emit(ev)
	}
	if stale {
		return false, true, machine.Called{}
	}
	began := a.Began
	if began.IsZero() {
		began = now
	}
	w := &machine.Approved{Approval: event.Approval{Decision: d.Decision, By: d.By, Reason: d.Reason}, Waited: now.Sub(began)}
	mc := t.askedFor(view, c)
	callID := machine.CallID(step, c.Index)
	var rec event.ToolCall
	switch {
	case d.Stopped:
		// The turn was stopped while the call waited.
		res := t.refuse(step, callID, mc, machine.RefusedCancelled, "", "Not run: the turn was stopped while the call waited for a person's decision.", w)
		t.tr.Put(view.Messages+c.Index, toolMessage(mc, res))
		return false, false, machine.Called{}
	case d.Decision == event.Approve:
		return true, false, machine.Called{LastProgress: now, Approval: w}
	case d.Decision == event.Expired:
		rec = t.unrun(step, callID, mc, event.OutcomeApprovalExpired, tool.ApprovalExpired(c.Name, t.approvalBudget(t.a.tools[c.Name]), w.Waited), w)
		rec.Phase = budget.PhaseApproval
	default:
		rec = t.unrun(step, callID, mc, event.OutcomeDenied, tool.Denied(c.Name, d.By, d.Reason), w)
	}
	rec = t.addToolRecord(rec)
	t.em.Emit(&event.ToolFinished{ToolCall: rec})
	t.tr.Put(view.Messages+c.Index, toolMessage(mc, rec.Result))
	return false, false, machine.Called{LastProgress: now}
}

// ask asks the turn's Approver for the decision on req. The error is the
// turn's stop; anything else becomes a decision: none in time is
// Expired, an Approver that fails denies the call, saying why.
func (t *turn) ask(ctx context.Context, req ApprovalRequest) (Decision, error) {
	if t.approver == nil {
		return Decision{Decision: event.Deny, By: "timebox",
			Reason: "nobody can decide: the program running this turn gave it no way to ask a person (agent.Input.Approver)"}, nil
	}
	actx, cancel := context.WithDeadline(ctx, req.ExpiresAt)
	defer cancel()
	dec, err := t.approve(actx, req)
	switch {
	case ctx.Err() != nil && (err != nil || dec.Decision == ""):
		return Decision{}, ctx.Err()
	case err == nil && validDecision(dec.Decision):
		return dec, nil
	case errors.Is(err, context.DeadlineExceeded) || err == nil && dec.Decision == "" && actx.Err() != nil:
		return Decision{Decision: event.Expired}, nil
	case err == nil:
		return Decision{Decision: event.Deny, By: "timebox", Reason: fmt.Sprintf("the approver answered %q, which is not a decision", dec.Decision)}, nil
	}
	return Decision{Decision: event.Deny, By: "timebox", Reason: "the decision could not be read: " + err.Error()}, nil
}

// approve asks the turn's Approver on a goroutine of its own, so that one
// that panics denies the call (saying so) rather than ending the process,
// and one that does not return within budget.CancelGrace of ctx's end
// (the call's approval_timeout, the turn's stop) is abandoned, as a Go
// tool that ignores its context is: the turn's ceiling holds whatever the
// Approver does.
func (t *turn) approve(ctx context.Context, req ApprovalRequest) (Decision, error) {
	type answer struct {
		dec Decision
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		defer func() {
			if r := recover(); r != nil {
				answered <- answer{err: fmt.Errorf("the approver panicked: %v", r)}
			}
		}()
		dec, err := t.approver.Approve(ctx, req)
		answered <- answer{dec, err}
	}()
	select {
	case a := <-answered:
		return a.dec, a.err
	case <-ctx.Done():
	}
	grace := time.NewTimer(budget.CancelGrace)
	defer grace.Stop()
	select {
	case a := <-answered:
		return a.dec, a.err
	case <-grace.C:
		return Decision{}, ctx.Err()
	}
}

func validDecision(d event.Decision) bool {
	return d == event.Approve || d == event.Deny || d == event.Expired
}

// unrun returns the record of a call a person's decision kept from
// running.
func (t *turn) unrun(step int, callID string, c model.ToolCall, outcome event.Outcome, result string, a *machine.Approved) event.ToolCall {
	now := time.Now()
	rec := event.ToolCall{CallID: callID, TurnID: t.s.TurnID, Step: step, Tool: c.Name, Arguments: arguments(c.Arguments),
		StartedAt: now, EndedAt: now, Outcome: outcome, Refused: string(outcome), Result: result}
	if e, ok := t.a.tools[c.Name]; ok {
		rec.Kind = string(e.Tool.Tool.Kind())
		tb := t.toolBudget(e)
		rec.TimeoutMS, rec.TimeoutSource = tb.Timeout.MS(), tb.Timeout.Source
		rec.IdleTimeoutMS, rec.Enforcement = tb.IdleTimeout.MS(), tb.Enforcement
	}
	applyApproval(&rec, a)
	return rec
}

// applyApproval puts a call's wait for a person, if it waited, into its
// record.
func applyApproval(rec *event.ToolCall, a *machine.Approved) {
	if a == nil {
		return
	}
	rec.ApprovalMS = a.Waited.Milliseconds()
	n := a.Approval
	rec.Approval = &n
}
