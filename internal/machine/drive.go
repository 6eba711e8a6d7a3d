package machine

import (
	"slices"
	"sync"
	"time"
)

// Driver runs a turn's units of work for Drive: in this process (package
// agent) or as Temporal activities (package temporal).
type Driver interface {
	// Now is the engine's clock: time.Now, or a workflow's.
	Now() time.Time
	// Check notes in s a stop that reached the turn from outside its
	// units — its ceiling, the step watchdog, a cancellation. It returns
	// false when the engine must stop driving the turn here, to drive it
	// on from s elsewhere (a Temporal workflow continuing as new).
	Check(s *State) bool
	// Run runs u (neither Tools nor End), updating s. It may run the
	// units after u as well, up to the next Tools or End.
	Run(s *State, u Unit)
	// Call runs one tool call of a batch of step and returns how it went.
	// The calls of a batch may run concurrently: Call must not change s.
	Call(s *State, step int, c Call) Called
	// Refuse records calls of step's batch that are not run, in their
	// order — Refused* says why — and returns how each went: the calls
	// past max_tool_calls of a batch are refused at once, however many
	// the model asked for.
	Refuse(s *State, step int, cs []Call, reason string) []Called
	// Group returns what runs the calls of one batch, at most slots at
	// once.
	Group(slots int) Group
	// Asks reports whether call c of the batch of s may need a person's
	// decision before it runs (the tool's approval): RunBatch then has
	// it wait for one (Approve) before it takes a slot.
	Asks(s *State, c Call) bool
	// Approve has call c of step's batch wait for a person's decision,
	// when it needs one, and reports whether the call runs. When it does
	// not — denied, expired, the turn stopped meanwhile — the call is
	// recorded as not run, and out says how the wait went. Like Call, it
	// may run concurrently with the batch's other calls and must not
	// change s.
	Approve(s *State, step int, c Call) (run bool, out Called)
	// Paused tells the engine that the turn's ceiling stopped (paused)
	// or runs again: the turn waits for nothing but people, or no longer
	// does. Ceiling is where the ceiling now falls (zero while paused).
	// RunBatch calls it under a lock of its own, in the order of the
	// changes.
	Paused(paused bool, ceiling time.Time)
}

// Group runs the calls of a batch concurrently: goroutines and a
// semaphore, or a workflow's coroutines and its semaphore.
type Group interface {
	// Acquire waits for a free slot; it returns false when the turn was
	// stopped first.
	Acquire() bool
	// Release frees a slot.
	Release()
	// Go runs f concurrently with a Driver for it (a workflow's coroutine
	// has a context of its own); Wait waits for every f.
	Go(f func(Driver))
	Wait()
}

// Called is how one call of a batch went, as the batch needs it: the
// result itself is in the Transcript.
type Called struct {
	// Stopped, when a turn-level budget or a cancellation stopped the turn
	// during the call, is what was running; Cause is what stopped it.
	// Engines whose units keep their own watchdogs report them; the
	// embedded engine notes both for the whole turn instead.
	Stopped *StopNote `json:"stopped,omitempty"`
	Cause   *Cause    `json:"cause,omitempty"`
	// LastProgress is the last progress signal the call saw, where its
	// engine keeps watchdogs per unit.
	LastProgress time.Time `json:"last_progress,omitzero"`
	// Approval is, from Approve, the wait of a call a person approved.
	Approval *Approved `json:"approval,omitempty"`
	// Suspended, from Approve, is a call whose wait was suspended with
	// its turn (Asked is its request): the batch is suspended.
	Suspended *Asked `json:"suspended,omitempty"`
}

// Refusal reasons: the turn reached max_tool_calls, or was stopped before
// the call could start.
const (
	RefusedLimit     = "limit"
	RefusedCancelled = "cancelled"
)

// Drive runs the turn of s with d until it is to end, and returns the End
// unit: the one loop of every engine. The caller runs the End (it may
// already have run, s.Finished). When d.Check stops it first, Drive
// returns the zero Unit.
func Drive(d Driver, s *State) Unit {
	for {
		if !d.Check(s) {
			return Unit{}
		}
		u := Next(s)
		switch u.Kind {
		case End, Suspend:
			return u
		case Tools:
			RunBatch(d, s, u)
		default:
			d.Run(s, u)
		}
	}
}

// Advance runs units of s with d until the next is a batch of tool calls
// or the end, and returns that unit: what an engine that runs a turn's
// model steps in one place and its tool calls in others (package temporal)
// runs in one unit of its own.
func Advance(d Driver, s *State) Unit {
	for {
		if !d.Check(s) {
			return Unit{}
		}
		u := Next(s)
		if u.Kind == End || u.Kind == Tools {
			return u
		}
		d.Run(s, u)
	}
}

// RunBatch runs the batch of tool calls u, up to parallel_tools at once,
// and notes how it went in s: max_tool_calls refuses the calls past it,
// a stop refuses the calls not yet started, the turn's tool time grows by
// the batch's, and what the calls met of a turn-level stop is kept.
//
// A call that needs a person's decision waits for it (Driver.Approve)
// without a slot, so that the batch's other calls run on; while the turn
// waits for nothing but people its ceiling stops (Pauses).
func RunBatch(d Driver, s *State, u Unit) {
	start := d.Now()
	outs := make([]Called, len(u.Calls))
	g := d.Group(int(max(1, s.Limits.ParallelTools.N)))
	// The calls read the state the batch began with; the loop counts on.
	view := *s
	waitedBefore := s.ApprovalWait
	p := &Pauses{Total: s.ApprovalWait}
	var pmu sync.Mutex
	change := func(waiting, working int) {
		pmu.Lock()
		defer pmu.Unlock()
		was := p.Paused()
		p.Change(d.Now(), waiting, working)
		if p.Paused() != was {
			var ceiling time.Time
			if !p.Paused() {
				ceiling = s.Start.Add(s.Budgets.Turn.D + p.Total)
			}
			d.Paused(p.Paused(), ceiling)
		}
	}
	// call runs call i with the state it starts with: the batch's, with
	// the ceiling as far as waits for people have moved it.
	call := func(d Driver, i int, c Call, progressed time.Time) {
		v := view
		if progressed.After(v.LastProgress) {
			// A decision is progress: the call's step window starts there.
			v.LastProgress = progressed
		}
		pmu.Lock()
		v.ApprovalWait = p.Total
		pmu.Unlock()
		change(0, 1)
		outs[i] = d.Call(&v, u.Step, c)
		change(0, -1)
	}
	// The calls past max_tool_calls (the batch's last: the count only
	// grows) are refused together once the others are under way.
	var limited []Call
	var limitedAt []int
	resumed := s.Resumed
	s.Resumed = nil
	done := map[int]bool{}
	for i, c := range u.Calls {
		if resumed != nil && slices.Contains(resumed.Done, c.Index) {
			// Ended before the turn was suspended: its result is in the
			// transcript.
			s.ToolCalls++
			done[i] = true
			continue
		}
		if resumed != nil {
			if a, ok := resumed.Waiting[c.Index]; ok {
				c.Waited = &a
			}
		}
		if int64(s.ToolCalls) >= s.Limits.MaxToolCalls.N {
			limited = append(limited, c)
			limitedAt = append(limitedAt, i)
			continue
		}
		s.ToolCalls++
		if s.Stop == nil && (c.Waited != nil || d.Asks(&view, c)) {
			g.Go(func(d Driver) {
				change(1, 0)
				run, out := d.Approve(&view, u.Step, c)
				change(-1, 0)
				if !run {
					outs[i] = out
					return
				}
				if !g.Acquire() {
					outs[i] = refuseOne(d, &view, u.Step, c, RefusedCancelled)
					return
				}
				defer g.Release()
				c.Approval = out.Approval
				call(d, i, c, out.LastProgress)
				if out.LastProgress.After(outs[i].LastProgress) {
					outs[i].LastProgress = out.LastProgress
				}
			})
			continue
		}
		if s.Stop != nil || !g.Acquire() {
			outs[i] = refuseOne(d, &view, u.Step, c, RefusedCancelled)
			continue
		}
		if len(u.Calls) == 1 {
			// One call (the common case) runs where the batch does: a
			// parked turn then costs one goroutine less.
			call(d, i, c, time.Time{})
			g.Release()
			continue
		}
		g.Go(func(d Driver) {
			defer g.Release()
			call(d, i, c, time.Time{})
		})
	}
	if len(limited) > 0 {
		for j, o := range d.Refuse(&view, u.Step, limited, RefusedLimit) {
			outs[limitedAt[j]] = o
		}
	}
	g.Wait()
	if sp := suspension(d, u, outs, done); sp != nil {
		// Suspended while it waited for nothing but people: the batch
		// goes on from sp when the turn is resumed, counting its calls
		// again.
		s.ToolCalls = view.ToolCalls
		s.ApprovalWait = p.Total
		s.ToolTime += d.Now().Sub(start) - (p.Total - waitedBefore)
		s.Suspended = sp
		return
	}
	s.Batch = nil
	s.Messages += len(u.Calls)
	s.Refused = len(limited)
	s.ApprovalWait = p.Total
	// The batch's time, less what it waited for nothing but people.
	s.ToolTime += d.Now().Sub(start) - (p.Total - waitedBefore)
	for _, o := range outs {
		if o.LastProgress.After(s.LastProgress) {
			s.LastProgress = o.LastProgress
		}
		s.Stopped = s.Stopped.Merge(o.Stopped)
		if s.Stop == nil && o.Cause != nil {
			s.Stop = o.Cause
		}
	}
}

// refuseOne refuses call c alone.
func refuseOne(d Driver, s *State, step int, c Call, reason string) Called {
	if out := d.Refuse(s, step, []Call{c}, reason); len(out) > 0 {
		return out[0]
	}
	return Called{}
}

// suspension returns the suspension of a batch one of whose calls was
// suspended (Called.Suspended), nil if none was.
func suspension(d Driver, u Unit, outs []Called, done map[int]bool) *Suspension {
	var sp *Suspension
	for i, o := range outs {
		if o.Suspended != nil {
			if sp == nil {
				sp = &Suspension{At: d.Now(), Waiting: map[int]Asked{}}
			}
			sp.Waiting[u.Calls[i].Index] = *o.Suspended
		}
	}
	if sp == nil {
		return nil
	}
	for i, c := range u.Calls {
		if _, waits := sp.Waiting[c.Index]; !waits || done[i] {
			sp.Done = append(sp.Done, c.Index)
		}
	}
	return sp
}

// Pauses is the clock of a turn's waits for people: the turn waits for
// nothing but people while a call waits for a decision and none works,
// and that time is not the turn's own — its ceiling stops
// (docs/decisions/approvals.md). Total is the time paused so far. The
// zero Pauses counts from nothing.
type Pauses struct {
	Total            time.Duration
	waiting, working int
	since            time.Time
}

// Paused reports whether the turn waits for nothing but people.
func (p *Pauses) Paused() bool { return p.waiting > 0 && p.working == 0 }

// Change counts calls that begin (1) or end (-1) waiting for a decision,
// and calls that begin or end working, at now.
func (p *Pauses) Change(now time.Time, waiting, working int) {
	was := p.Paused()
	p.waiting += waiting
	p.working += working
	switch is := p.Paused(); {
	case is && !was:
		p.since = now
	case was && !is:
		p.Total += now.Sub(p.since)
	}
}
