package agent

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/model"
)

// inProcess runs a turn's units in this process, for machine.Drive (Run)
// and machine.Advance (the units an engine runs here, engineUnits).
type inProcess struct {
	t   *turn
	ctx context.Context
}

// Now returns time.Now (machine.Driver).
func (d *inProcess) Now() time.Time { return time.Now() }

// Check notes in s a stop that reached the turn's context; it never asks
// the engine to stop driving (machine.Driver).
func (d *inProcess) Check(s *machine.State) bool {
	if s.Stop == nil && d.ctx.Err() != nil {
		s.Stop = machine.CauseOf(budget.Cause(d.ctx))
	}
	return true
}

// Run runs unit u in this process (machine.Driver).
func (d *inProcess) Run(_ *machine.State, u machine.Unit) { d.t.unit(d.ctx, u) }

// Call runs call c of step's batch in this process (machine.Driver).
func (d *inProcess) Call(view *machine.State, step int, c machine.Call) machine.Called {
	d.t.callUnit(d.ctx, view, step, c)
	return machine.Called{}
}

// Refuse records calls cs of step's batch as not run, for reason
// (machine.Driver).
func (d *inProcess) Refuse(view *machine.State, step int, cs []machine.Call, reason string) []machine.Called {
	d.t.refuseUnit(view, step, cs, reason)
	return make([]machine.Called, len(cs))
}

// Asks reports whether call c may need a person's decision before it runs
// (machine.Driver).
func (d *inProcess) Asks(view *machine.State, c machine.Call) bool { return d.t.asks(view, c) }

// Approve has call c wait for a person's decision when it needs one, and
// reports whether it runs (machine.Driver).
func (d *inProcess) Approve(view *machine.State, step int, c machine.Call) (bool, machine.Called) {
	return d.t.approveUnit(d.ctx, view, step, c)
}

// Paused stops or restarts the turn's ceiling, and lets a requested
// suspension happen while the turn waits for nothing but people
// (machine.Driver).
func (d *inProcess) Paused(paused bool, at time.Time) {
	d.t.ceiling.pause(paused, at)
	if d.t.susp != nil {
		d.t.susp.pause(paused)
	}
}

// Group returns a group that runs a batch's calls on goroutines, at most
// slots at once (machine.Driver).
func (d *inProcess) Group(slots int) machine.Group {
	return &group{d: d, sem: make(chan struct{}, slots)}
}

// group runs the calls of a batch on goroutines, a channel their
// semaphore.
type group struct {
	d   *inProcess
	sem chan struct{}
	wg  sync.WaitGroup
	// panicked is the first panic of a call's goroutine (a caller's sink
	// or hook that panicked there): Wait panics with it on the turn's
	// goroutine, where Run's caller can recover it, rather than the
	// call's goroutine ending the process.
	panicked atomic.Pointer[any]
}

// Acquire waits for a free slot; it returns false when the turn's context
// ended first.
func (g *group) Acquire() bool {
	if g.d.ctx.Err() != nil {
		return false
	}
	select {
	case g.sem <- struct{}{}:
		return true
	case <-g.d.ctx.Done():
		return false
	}
}

// Release frees a slot.
func (g *group) Release() { <-g.sem }

// Go runs f on a goroutine of its own, keeping the first panic for Wait.
func (g *group) Go(f func(machine.Driver)) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		defer func() {
			if v := recover(); v != nil {
				g.panicked.CompareAndSwap(nil, &v)
			}
		}()
		f(g.d)
	}()
}

// Wait waits for every f, then panics with the first panic of one, on the
// turn's goroutine.
func (g *group) Wait() {
	g.wg.Wait()
	if v := g.panicked.Load(); v != nil {
		panic(*v)
	}
}

// unit runs u: Begin, Think or Compact.
func (t *turn) unit(ctx context.Context, u machine.Unit) {
	switch u.Kind {
	case machine.Begin:
		t.begin()
	case machine.Think:
		t.thinkUnit(ctx, u)
	case machine.Compact:
		t.compactUnit(ctx, u)
	}
}

// begin is the Begin unit: turn_started. A turn started for another agent
// than this one — an engine's runner and worker built from different agent
// files — ends at once, refused, saying which.
func (t *turn) begin() {
	t.em.Emit(t.started())
	t.s.Begun = true
	if want := t.s.Agent; want != nil && want.Fingerprint != t.a.fingerprint {
		t.s.End = &machine.Ending{Reason: budget.AgentMismatch, Message: mismatch(want, t.a.Ref())}
	}
}

// memTranscript is a turn's transcript in memory.
type memTranscript struct {
	text    string
	history []model.Message
	summary string
	partial string

	mu   sync.Mutex // the calls of a batch put their results at once
	msgs []model.Message
}

// Input returns the user's message.
func (m *memTranscript) Input() string { return m.text }

// History returns the session's conversation before the turn.
func (m *memTranscript) History() []model.Message { return m.history }

// Summary returns the compaction summary.
func (m *memTranscript) Summary() string { return m.summary }

// SetSummary sets the compaction summary.
func (m *memTranscript) SetSummary(s string) { m.summary = s }

// Partial returns what the last model attempt streamed.
func (m *memTranscript) Partial() string { return m.partial }

// SetPartial sets what the last model attempt streamed.
func (m *memTranscript) SetPartial(s string) { m.partial = s }

// Records returns ok false: the turn keeps its records itself.
func (m *memTranscript) Records() ([]event.ToolCall, []event.ModelCall, bool) { return nil, nil, false }

// Messages returns the messages the turn added so far.
func (m *memTranscript) Messages() []model.Message {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.msgs
}

// Message returns the i-th message the turn added, from 0.
func (m *memTranscript) Message(i int) model.Message {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.msgs[i]
}

// Put sets message i, growing the list to hold it; the calls of a batch
// may put theirs at once.
func (m *memTranscript) Put(i int, msg model.Message) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if i >= len(m.msgs) {
		m.msgs = slices.Grow(m.msgs, i+1-len(m.msgs))[:i+1]
	}
	m.msgs[i] = msg
}

// suspend returns the per-conversation state of the chain's resumable
// providers.
func (a *Agent) suspend(conv string) map[int]json.RawMessage {
	var out map[int]json.RawMessage
	for i, p := range a.resumable() {
		if out == nil {
			out = map[int]json.RawMessage{}
		}
		out[i] = p.Suspend(conv)
	}
	return out
}

// resumeProviders gives the chain's resumable providers their
// per-conversation state.
func (a *Agent) resumeProviders(conv string, states map[int]json.RawMessage) {
	for i, p := range a.resumable() {
		if st, ok := states[i]; ok {
			p.Resume(conv, st)
		}
	}
}

// resumable returns the chain's providers that keep per-conversation
// state, each once, by the index of its first endpoint.
func (a *Agent) resumable() map[int]model.Resumable {
	var out map[int]model.Resumable
	seen := map[model.Resumable]bool{}
	for i, ep := range a.models {
		r, ok := ep.Provider.(model.Resumable)
		if !ok || seen[r] {
			continue
		}
		seen[r] = true
		if out == nil {
			out = map[int]model.Resumable{}
		}
		out[i] = r
	}
	return out
}
