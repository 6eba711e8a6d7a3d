package machine

import "time"

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
	// Refuse records a call of step's batch that is not run: Refused*
	// says why.
	Refuse(s *State, step int, c Call, reason string) Called
	// Group returns what runs the calls of one batch, at most slots at
	// once.
	Group(slots int) Group
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
		case End:
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
func RunBatch(d Driver, s *State, u Unit) {
	start := d.Now()
	outs := make([]Called, len(u.Calls))
	g := d.Group(int(max(1, s.Limits.ParallelTools.N)))
	// The calls read the state the batch began with; the loop counts on.
	view := *s
	refused := 0
	for i, c := range u.Calls {
		if int64(s.ToolCalls) >= s.Limits.MaxToolCalls.N {
			refused++
			outs[i] = d.Refuse(&view, u.Step, c, RefusedLimit)
			continue
		}
		s.ToolCalls++
		if s.Stop != nil || !g.Acquire() {
			outs[i] = d.Refuse(&view, u.Step, c, RefusedCancelled)
			continue
		}
		if len(u.Calls) == 1 {
			// One call (the common case) runs where the batch does: a
			// parked turn then costs one goroutine less.
			outs[i] = d.Call(&view, u.Step, c)
			g.Release()
			continue
		}
		g.Go(func(d Driver) {
			defer g.Release()
			outs[i] = d.Call(&view, u.Step, c)
		})
	}
	g.Wait()
	s.Batch = nil
	s.Messages += len(u.Calls)
	s.Refused = refused
	s.ToolTime += d.Now().Sub(start)
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
