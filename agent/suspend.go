package agent

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/model"
)

// Checkpoint is a turn suspended while it waited for nothing but people's
// decisions (Input.Suspend): what Resume goes on from, in this process or
// another. Store it as JSON; its content is timebox's own.
type Checkpoint struct {
	// State is the turn machine's state: its ids, budgets, counters and
	// the step under way; a shutdown that reached the turn as it
	// suspended is left out.
	State machine.State `json:"state"`
	// Text is the user's message, and History the session's conversation
	// before the turn, repaired.
	Text    string          `json:"text"`
	History []model.Message `json:"history,omitempty"`
	// Added are the messages the turn added so far, from the user's.
	Added []model.Message `json:"added"`
	// Summary is the compaction summary, empty when the turn compacted
	// nothing; Partial is what the last model attempt streamed.
	Summary string `json:"summary,omitempty"`
	Partial string `json:"partial,omitempty"`
	// Tools and Models are the records of the calls that ended so far.
	Tools  []event.ToolCall  `json:"tool_calls,omitempty"`
	Models []event.ModelCall `json:"model_calls,omitempty"`
	// Seq is the seq of the turn's last event: a resumed turn numbers on.
	Seq int64 `json:"seq"`
}

// TurnID returns the id of the suspended turn.
func (c *Checkpoint) TurnID() string { return c.State.TurnID }

// errSuspended ends the waits of a turn being suspended.
var errSuspended = errors.New("the turn was suspended")

// suspender suspends a turn once it waits for nothing but people, after
// its Input.Suspend was closed.
type suspender struct {
	in        <-chan struct{} // Input.Suspend
	mu        sync.Mutex
	requested bool
	paused    bool
	now       chan struct{} // closed when the turn suspends
	once      sync.Once
}

func newSuspender(in <-chan struct{}) *suspender { return &suspender{in: in, now: make(chan struct{})} }

// request notes that the turn is to suspend, at once if it waits for
// nothing but people.
func (s *suspender) request() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.requested = true
	if s.paused {
		s.once.Do(func() { close(s.now) })
	}
}

// pause notes whether the turn waits for nothing but people.
func (s *suspender) pause(paused bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.paused = paused
	if paused && s.requested {
		s.once.Do(func() { close(s.now) })
	}
}

// suspends reports whether a wait that ended under wctx (watch, of ctx)
// ended because the turn suspends: it did (errSuspended), or its process
// is shutting down after asking it to (a shutdown that did not wait for
// the suspension).
func (s *suspender) suspends(ctx, wctx context.Context) bool {
	if s == nil {
		return false
	}
	if ctx.Err() == nil {
		return errors.Is(context.Cause(wctx), errSuspended)
	}
	// Input.Suspend is closed before the shutdown that follows it, which
	// may reach the wait before the turn heard of the request.
	select {
	case <-s.in:
	default:
		return false
	}
	ce, ok := budget.AsCancel(budget.Cause(ctx))
	return ok && ce.Reason == budget.Shutdown
}

// watch makes ctx end with errSuspended when the turn suspends.
func (s *suspender) watch(ctx context.Context) (context.Context, func()) {
	if s == nil {
		return ctx, func() {}
	}
	wctx, cancel := context.WithCancelCause(ctx)
	go func() {
		select {
		case <-s.now:
			cancel(errSuspended)
		case <-wctx.Done():
		}
	}()
	return wctx, func() { cancel(nil) }
}

// checkpoint returns the turn's checkpoint, once Drive returned Suspend.
func (t *turn) checkpoint() *Checkpoint {
	mt, _ := t.tr.(*memTranscript)
	t.em.Close()
	cp := &Checkpoint{State: *t.s, Seq: t.em.Seq()}
	// A shutdown that reached the turn as it suspended is not the
	// resumed turn's.
	cp.State.Stop, cp.State.Stopped = nil, nil
	// Providers that keep a conversation's state (the script model's
	// place in its script) go on where they were.
	cp.State.Providers = t.a.suspend(t.conversationID())
	if mt != nil {
		cp.Text, cp.History, cp.Summary, cp.Partial = mt.text, mt.history, mt.summary, mt.partial
		cp.Added = append([]model.Message(nil), mt.Messages()...)
	}
	t.mu.Lock()
	cp.Tools = append(cp.Tools, t.toolRecs...)
	cp.Models = append(cp.Models, t.modelRecs...)
	t.mu.Unlock()
	return cp
}

// Resume goes on with a turn suspended in cp (Result.Suspended), as Run
// would have: its batch's calls that ended are not run again, those that
// waited for a person wait again — a decision made while it was suspended
// is used, unless it is too old (ApprovalFresh), then the call is asked
// again. The time it was suspended is a wait for people: its ceiling does
// not count it. in gives the Approver and Suspend; its text and history
// are the checkpoint's.
func (a *Agent) Resume(ctx context.Context, cp *Checkpoint, in Input, sinks ...event.Sink) (*Result, error) {
	s := cp.State
	if s.Suspended == nil {
		return nil, fmt.Errorf("turn %s was not suspended", s.TurnID)
	}
	if s.Agent != nil && s.Agent.Fingerprint != a.fingerprint {
		return nil, errors.New(mismatch(s.Agent, a.Ref()))
	}
	if waited := time.Since(s.Suspended.At); waited > 0 {
		s.ApprovalWait += waited
	}
	s.Resumed, s.Suspended = s.Suspended, nil
	tr := &memTranscript{text: cp.Text, history: cp.History, summary: cp.Summary, partial: cp.Partial, msgs: cp.Added}
	t := a.resume(&s, tr, in.Approver, sinks)
	t.em = event.NewEmitterAfter(s.TurnID, cp.Seq, t.emSinks...)
	t.toolRecs, t.modelRecs = cp.Tools, cp.Models
	// The turn's span, begun by the process that suspended it and never
	// ended there, is made by the one that ends the turn, with the ids
	// its calls name as their parent (docs/decisions/turn-span-of-a-lost-turn.md).
	traced := a.turnSpan(&s)
	res := a.drive(ctx, t, in)
	if res.Record != nil && traced != nil {
		traced(res.Record)
	}
	return res, nil
}
