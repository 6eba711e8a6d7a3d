package agent

import (
	"slices"
	"strings"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
)

// StopOf returns the closing message, the flags and the limit (the budget
// that stopped it, for turn_finished) of a turn of a's, stopped by a
// turn-level budget (turn_timeout, no_progress, llm_budget_exhausted) as
// end says at at, and ended now: the words of the embedded engine's own
// end, for an engine's runner that ends a turn its units could not end
// (temporal's, past a budget of a turn no worker runs).
//
// s is the turn's state as it was started. Its events tell what it was
// doing at at, as the embedded engine's liveness would have it at its stop
// — a model call waiting for its reply or streaming it, a compaction, a
// call waiting for a person, the last step and how long ago it finished —
// and whether a compaction of it timed out; running are the records of
// its tool calls that were running (store.End.Stop), which say which ran.
// The message of any other end needs the turn's transcript: use the
// turn's own.
func (a *Agent) StopOf(s *machine.State, end machine.Ending, events []event.Event, running []event.ToolCall, at, now time.Time) (string, event.Flags, *event.BudgetValue) {
	st := *s
	note := a.snapOfEvents(&st, events, running, at).note()
	t := &turn{a: a, s: &st}
	return t.message(end, note, now), stopFlags(&st, end, note), t.limit(end)
}

// snapOfEvents returns the snapshot freeze would have taken at at of a
// turn of state s whose units ran elsewhere, as its events tell it, with
// the tool calls running; it notes in s a compaction that timed out
// (CompactionTimeout), as compact does. The activities are those its
// units began: a model call from llm_started to llm_finished (streaming
// from its first llm_delta), a compaction, on the primary model, from
// compaction_started to compaction_finished, a call waiting for a person
// from approval_requested to its decision, a call from tool_started to
// tool_finished. At is the stop: what its events tell after it is not
// what ran at it (a call a worker stopped there, before it died), and a
// running call's start after it is taken as at.
func (a *Agent) snapOfEvents(s *machine.State, events []event.Event, running []event.ToolCall, at time.Time) stopSnap {
	clip := func(t time.Time) time.Time {
		if t.After(at) {
			return at
		}
		return t
	}
	var (
		model, compaction *activity
		last              *activity
		lastEnded         time.Time
		waits             = map[string]*activity{}
		begun             = map[string]bool{} // the calls that ran
	)
	begin := func(x *activity, t time.Time) *activity {
		x.started, last = t, x
		return x
	}
	ended := func(t time.Time) { lastEnded = t }
	unwait := func(id string, t time.Time) {
		if waits[id] != nil {
			delete(waits, id)
			ended(t)
		}
	}
	primary := ""
	if len(a.models) > 0 {
		primary = a.models[0].Model
	}
	for _, e := range events {
		if e.At.After(at) {
			continue // after the stop
		}
		switch d := e.Data.(type) {
		case *event.LLMStarted:
			model = begin(&activity{step: d.Step, subject: modelSubject(d.Model)}, e.At)
		case *event.LLMDelta:
			if model != nil {
				model.streaming = true
			}
		case *event.LLMFinished:
			if !d.Compaction && model != nil {
				model = nil
				ended(e.At)
			}
		case *event.CompactionStarted:
			compaction = begin(&activity{step: d.Step, subject: compactionSubject(primary), compaction: true}, e.At)
		case *event.CompactionFinished:
			if compaction != nil {
				compaction = nil
				ended(e.At)
			}
			if d.Phase == budget.PhaseCompaction {
				s.CompactionTimeout = true
			}
		case *event.ApprovalRequested:
			if waits[d.CallID] == nil {
				waits[d.CallID] = begin(&activity{step: d.Step, subject: toolSubject(d.Tool), callID: d.CallID, approvalOf: d.Tool}, e.At)
			}
		case *event.ApprovalDecided:
			unwait(d.CallID, e.At)
		case *event.ToolStarted:
			unwait(d.CallID, e.At)
			begun[d.CallID] = true
			begin(&activity{step: d.Step, subject: toolSubject(d.Tool), callID: d.CallID, tool: d.Tool}, e.At)
		case *event.ToolFinished:
			unwait(d.CallID, e.At)
			if begun[d.CallID] {
				delete(begun, d.CallID)
				ended(e.At)
			}
		}
	}
	var runs []*activity
	for _, x := range []*activity{model, compaction} {
		if x != nil {
			runs = append(runs, x)
		}
	}
	for _, x := range waits {
		runs = append(runs, x)
	}
	for _, c := range running {
		runs = append(runs, &activity{step: c.Step, subject: toolSubject(c.Tool), callID: c.CallID, tool: c.Tool, started: clip(c.StartedAt)})
	}
	// In the order they started, as the liveness keeps them; a tie by
	// call id, for a map's.
	slices.SortStableFunc(runs, func(x, y *activity) int {
		if c := x.started.Compare(y.started); c != 0 {
			return c
		}
		return strings.Compare(x.callID, y.callID)
	})
	return snapOf(at, runs, last, lastEnded)
}
