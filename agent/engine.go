package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/tool"
)

// An engine that runs a turn's units elsewhere (package temporal) reaches
// them through machine.UnitsOf: the machinery is not part of this
// package's API (docs/decisions/one-turn-machine.md).
func init() {
	machine.SetUnits(func(a any) (machine.Units, bool) {
		ag, ok := a.(*Agent)
		if !ok || ag == nil {
			return nil, false
		}
		return engineUnits{ag}, true
	})
}

// engineUnits are the agent's units for an engine: each builds the turn of
// the state it is given, runs under the turn's watchdogs, and leaves in
// the state what the next unit needs.
type engineUnits struct{ a *Agent }

// Ref returns the agent's reference (machine.Units).
func (u engineUnits) Ref() machine.AgentRef { return u.a.Ref() }

// NewState returns the state of a turn that begins now for the agent, and
// its history repaired (machine.Units).
func (u engineUnits) NewState(turnID, sessionID string, history []model.Message, req budget.Request) (*machine.State, []model.Message) {
	s, tr := u.a.newState(Input{TurnID: turnID, SessionID: sessionID, History: history, Budgets: req})
	ref := u.a.Ref()
	s.Agent = &ref
	return s, tr.history
}

// ToolBudget returns the named tool's budget in the turn of s, its retries,
// and whether the agent has the tool (machine.Units).
func (u engineUnits) ToolBudget(s *machine.State, name string) (budget.ToolBudget, int, bool) {
	e, ok := u.a.tools[name]
	if !ok {
		return budget.ToolBudget{}, 0, false
	}
	return turnToolBudget(e, &s.Budgets), e.Retries, true
}

// Advance runs units of s up to the next batch of tool calls or the end,
// and ends the turn when a unit decided its end (machine.Units).
func (u engineUnits) Advance(ctx context.Context, s *machine.State, tr machine.Transcript, sinks ...event.Sink) *machine.Ended {
	t := u.a.resume(s, tr, nil, sinks)
	var next machine.Unit
	t.under(ctx, func(ctx context.Context) {
		next = machine.Advance(&inProcess{t: t, ctx: ctx}, s)
	})
	s.Stopped = s.Stopped.Merge(t.note())
	s.Providers = u.a.suspend(t.conversationID())
	if next.Kind != machine.End || s.Stop != nil && s.End == nil {
		// A stop from outside is the engine's to end: it may know more of
		// it (who cancelled) than this unit.
		t.em.Close()
		return nil
	}
	res := t.finish(*next.End)
	return &machine.Ended{Record: res.Record, Messages: res.Messages}
}

// Call runs call c of step's batch under the turn's watchdogs; s is not
// changed (machine.Units).
func (u engineUnits) Call(ctx context.Context, s *machine.State, step int, c machine.Call, tr machine.Transcript, sinks ...event.Sink) machine.Called {
	view := *s
	t := u.a.resume(&view, tr, nil, sinks)
	var out machine.Called
	t.under(ctx, func(ctx context.Context) {
		t.callUnit(ctx, &view, step, c)
		out.Cause = machine.CauseOf(budget.Cause(ctx))
	})
	t.em.Close()
	out.Stopped = t.note()
	out.LastProgress = view.LastProgress
	return out
}

// Refuse records calls cs of step's batch as not run, for reason
// (machine.Units).
func (u engineUnits) Refuse(s *machine.State, step int, cs []machine.Call, reason string, tr machine.Transcript, sinks ...event.Sink) []machine.Called {
	t := u.a.resume(s, tr, nil, sinks)
	t.refuseUnit(s, step, cs, reason)
	t.em.Close()
	return make([]machine.Called, len(cs))
}

// Lost records call c, lost with its worker, unless its record reached the
// store (machine.Units).
func (u engineUnits) Lost(s *machine.State, step int, c machine.Call, l machine.Loss, tr machine.Transcript, sinks ...event.Sink) machine.Called {
	t := u.a.resume(s, tr, nil, sinks)
	defer t.em.Close()
	mc := t.askedFor(s, c)
	if l.Recorded != nil {
		// The call ended and its record reached the store: only its
		// report was lost. The model is told what the record says.
		t.tr.Put(s.Messages+c.Index, toolMessage(mc, l.Recorded.Result))
		return machine.Called{}
	}
	res := t.lost(step, machine.CallID(step, c.Index), mc, l)
	t.tr.Put(s.Messages+c.Index, toolMessage(mc, res))
	return machine.Called{}
}

// LostAttempts records step's model call attempts lost with their worker:
// outcome interrupted, phase worker_lost (machine.Units).
func (u engineUnits) LostAttempts(s *machine.State, step int, lost []machine.LostAttempt, why string, sinks ...event.Sink) {
	t := u.a.resume(s, &memTranscript{}, nil, sinks)
	defer t.em.Close()
	now := time.Now()
	for _, at := range lost {
		rec := event.ModelCall{Step: step, Model: at.Model, Provider: at.Provider, Profile: at.Profile, Attempt: at.Attempt,
			StartedAt: at.Started, Outcome: event.OutcomeInterrupted, Phase: budget.PhaseWorkerLost,
			Error: "the attempt was lost: " + why + "; it was asked again"}
		if !at.Started.IsZero() {
			// What it is known to have run: to its last chunk stored. The
			// wait until the loss was noticed is no model's time.
			last := at.Started
			if at.Last.After(last) {
				last = at.Last
			}
			rec.StreamMS = last.Sub(at.Started).Milliseconds()
			// FirstChunkMS stays 0, unknown: the first chunk (a
			// message_start, a role chunk, a thinking block) stores no
			// llm_delta, and the first text stored may be long after it
			// (docs/temporal.md).
			rec.Error = fmt.Sprintf("the attempt was lost: %s; it was last heard from %s after it began, and the loss noticed %s after that; it was asked again",
				why, budget.RoundHuman(last.Sub(at.Started)), budget.RoundHuman(now.Sub(last)))
		}
		if !at.Compaction {
			// Its span, made from the record, takes the ids its worker's
			// span had, which its model server was sent.
			t.spans.adoptChat(at.Traceparent, step, at.Attempt, at.Model, at.Provider, at.Started)
			t.em.Emit(&event.LLMFinished{ModelCall: rec})
			s.Attempts = max(s.Attempts, at.Attempt)
			continue
		}
		// A compaction runs on the primary model (compact), and is
		// recorded as one: compaction_finished with its record. The turn
		// compacts again when it is still due.
		ep := u.a.models[0]
		rec.Step, rec.Model, rec.Provider, rec.Profile, rec.Compaction = at.Step, ep.Model, ep.ProviderName, ep.Profile, true
		// Its span takes the ids its compaction_started named, those its
		// worker's span had, which its model server was sent.
		t.spans.adoptCompaction(at.Traceparent, at.Step, at.Attempt, ep.Model, ep.ProviderName, at.Started)
		rec.Error = "the compaction was lost: " + why + "; it is tried again when still due"
		t.em.Emit(&event.CompactionFinished{Step: at.Step, Outcome: rec.Outcome, Phase: rec.Phase, DurationMS: rec.StreamMS,
			TokensBefore: at.EstimatedTokens, TokensAfter: at.EstimatedTokens,
			Message: "The compaction was lost: " + why + ". It is tried again when still due.", Record: &rec})
		if at.Step == step {
			s.CompactAttempts = max(s.CompactAttempts, at.Attempt)
		}
	}
}

// AsksApproval reports whether the named tool's calls may need a person's
// decision (machine.Units).
func (u engineUnits) AsksApproval(name string) bool {
	e, ok := u.a.tools[name]
	return ok && e.NeedsApproval != nil
}

// Ask has call c of step's batch ask for a person's decision, when its tool
// needs one (machine.Units).
func (u engineUnits) Ask(ctx context.Context, s *machine.State, step int, c machine.Call, round int, began time.Time,
	record func(context.Context, machine.Asked) error, tr machine.Transcript, sinks ...event.Sink) (machine.Asked, *machine.Decision) {
	t := u.a.resume(s, tr, nil, sinks)
	defer t.em.Close()
	return t.askUnit(ctx, s, step, c, round, began, record)
}

// Decided ends the wait of a with d and reports whether the call runs, or
// is asked again (machine.Units).
func (u engineUnits) Decided(s *machine.State, step int, c machine.Call, a machine.Asked, d machine.Decision, tr machine.Transcript,
	sinks ...event.Sink) (bool, bool, machine.Called) {
	t := u.a.resume(s, tr, nil, sinks)
	defer t.em.Close()
	return t.decidedUnit(s, step, c, a, d)
}

// StillWorking emits the still_working of a beat at now for calls running
// elsewhere, when one of them is silent (machine.Units).
func (u engineUnits) StillWorking(s *machine.State, calls []machine.Running, now time.Time, sinks ...event.Sink) {
	notice := s.Budgets.ProgressNotice.D
	if notice <= 0 || len(calls) == 0 {
		return
	}
	// The turn's liveness, with the calls as its running activities: the
	// notice is the one its own beat would make (noticeLocked).
	base := now
	for _, c := range calls {
		base = minTime(base, c.Started, c.LastReport)
	}
	l := &liveness{notice: notice, base: base}
	for _, c := range calls {
		a := &activity{step: c.Step, subject: toolSubject(c.Tool), callID: c.CallID, tool: c.Tool, started: c.Started, limit: c.Limit}
		if !c.LastReport.IsZero() {
			a.lastReport.Store(int64(c.LastReport.Sub(base)) + 1)
		}
		l.running = append(l.running, a)
	}
	l.mu.Lock()
	n := l.noticeLocked(now)
	l.mu.Unlock()
	if n == nil {
		return
	}
	t := u.a.resume(s, &memTranscript{}, nil, sinks)
	t.em.Emit(n)
	t.em.Close()
}

// minTime returns the earliest of a and the non-zero times of ts.
func minTime(a time.Time, ts ...time.Time) time.Time {
	for _, t := range ts {
		if !t.IsZero() && t.Before(a) {
			a = t
		}
	}
	return a
}

// TurnSpan begins the turn's span for the process that stores its end,
// and returns what ends it (machine.Units).
func (u engineUnits) TurnSpan(s *machine.State) func(*event.Turn) { return u.a.turnSpan(s) }

// End ends the turn as e says (machine.Units).
func (u engineUnits) End(s *machine.State, e machine.Ending, tr machine.Transcript, sinks ...event.Sink) *machine.Ended {
	t := u.a.resume(s, tr, nil, sinks)
	res := t.finish(e)
	return &machine.Ended{Record: res.Record, Messages: res.Messages}
}

// lost records a call that was running where it was lost — a worker that
// died, or stopped answering — and emits its tool_finished: outcome
// interrupted, phase worker_lost, the time it is known to have run (to its
// last heartbeat) apart from when the loss was noticed, the progress it
// reported, and a tool_error for the model saying that the call was not
// run again (or how many times it was, for a tool that declares retries),
// so it may or may not have done its work.
func (t *turn) lost(step int, callID string, c model.ToolCall, l machine.Loss) string {
	noticed := l.Noticed
	if noticed.IsZero() {
		noticed = time.Now()
	}
	it, they := "It", "It"
	again := "It was not run again, so it may or may not have done its work"
	if l.Runs > 1 {
		// A tool that declares retries: each run was lost in turn.
		it, they = "Its last run", "Its runs"
		again = fmt.Sprintf("It was run %d times (tools[%s].retries), each lost with its worker, and is not run again: it may or may not have done its work, once or more",
			l.Runs, c.Name)
	}
	ran := it + " had not reported starting."
	started, ended := l.Started, l.Started.Add(l.Ran)
	if l.Started.IsZero() {
		started, ended = noticed, noticed
	} else {
		ran = fmt.Sprintf("%s had run for at least %s (its last heartbeat); the loss was noticed %s after that.",
			it, budget.RoundHuman(l.Ran), budget.RoundHuman(noticed.Sub(ended)))
	}
	if l.Reports > 0 {
		ran += fmt.Sprintf(" %s had reported progress %d times.", they, l.Reports)
	}
	msg := fmt.Sprintf("The call was lost: %s. %s %s; check before asking for it again.", l.Why, ran, again)
	res := tool.Refusal(c.Name, "worker_lost", "", msg)
	rec := event.ToolCall{CallID: callID, TurnID: t.s.TurnID, Step: step, Tool: c.Name, Arguments: arguments(c.Arguments),
		StartedAt: started, EndedAt: ended, DurationMS: ended.Sub(started).Milliseconds(), NoticedAt: noticed,
		Outcome: event.OutcomeInterrupted, Phase: budget.PhaseWorkerLost, Result: res, ProgressCount: l.Reports}
	if l.Runs > 1 {
		rec.Runs, rec.FirstStartedAt = l.Runs, l.First
	}
	if e, ok := t.a.tools[c.Name]; ok {
		rec.Kind = string(e.Tool.Tool.Kind())
		tb := t.toolBudget(e)
		rec.TimeoutMS, rec.TimeoutSource = tb.Timeout.MS(), tb.Timeout.Source
		rec.IdleTimeoutMS, rec.Enforcement = tb.IdleTimeout.MS(), tb.Enforcement
	}
	rec = t.addToolRecord(rec)
	// Its span, made from the record, takes the ids its worker's span
	// had, which its tool was given (Loss.Traceparent).
	t.spans.adoptTool(l.Traceparent, rec.Step, rec.CallID, rec.Tool, rec.Kind, rec.Enforcement, rec.StartedAt)
	t.em.Emit(&event.ToolFinished{ToolCall: rec})
	return res
}

// Ref returns what identifies the agent to an engine: its name, where it
// was defined (Config.Origin) and its fingerprint.
func (a *Agent) Ref() machine.AgentRef {
	return machine.AgentRef{Name: a.name, Origin: a.origin, Fingerprint: a.fingerprint, Context: a.contextSettings()}
}

// contextSettings are the agent's context settings, which its fingerprint
// holds, for a mismatch's message.
func (a *Agent) contextSettings() string {
	notes := "off"
	if a.timeNotes {
		notes = "on"
	}
	return fmt.Sprintf("context.compact_at %d, context.time_notes %s", a.compactAt, notes)
}

// mismatch says why a turn started for agent want is refused by agent have.
func mismatch(want *machine.AgentRef, have machine.AgentRef) string {
	if want.Context != "" && have.Context != "" && want.Context != have.Context && want.Origin == have.Origin && want.Name == have.Name {
		// The same file, as often, but a flag or variable of the runner's
		// (--compact-at, --time-notes) changed its context settings.
		return fmt.Sprintf("Refused: the turn was started with the agent of %s with %s, but the worker that took it runs %s with %s "+
			"(a --compact-at or --time-notes flag, or TIMEBOX_COMPACT_AT or TIMEBOX_TIME_NOTES, of one and not the other). Nothing was run. "+
			"Give the gateway or run the same settings as its workers, or none.", describeRef(*want), want.Context, describeRef(have), have.Context)
	}
	return fmt.Sprintf("Refused: the turn was started with the agent of %s, but the worker that took it runs %s, a different agent "+
		"(its instructions, models or tools differ). Nothing was run. Run workers built from %s on a task queue of their own (--task-queue), "+
		"or start the turn with %s.", describeRef(*want), describeRef(have), describeRef(*want), describeRef(have))
}

func describeRef(r machine.AgentRef) string {
	switch {
	case r.Origin != "" && r.Name != "":
		return fmt.Sprintf("%s (%q)", r.Origin, r.Name)
	case r.Origin != "":
		return r.Origin
	case r.Name != "":
		return fmt.Sprintf("%q", r.Name)
	}
	return "fingerprint " + r.Fingerprint[:12]
}

// fingerprint digests what makes the agent, for AgentRef: its name,
// instructions, model chain, compaction threshold, whether the model is
// told its time (context.time_notes: a worker that tells it and a runner
// that does not make different requests), and each tool's spec, kind,
// retries, own budget and whether it may ask for approval, with its own
// approval timeout. Budgets a tool takes from the turn's defaults are
// left out (they travel with the turn), and so are credentials. Of
// NeedsApproval only whether it is set is known: a function cannot be
// digested.
func fingerprint(a *Agent) string {
	type toolPrint struct {
		Name, Description, Kind string
		Schema                  json.RawMessage
		Timeout, Idle           string
		Enforcement             budget.Enforcement
		Retries                 int
		// omitempty: an agent without approvals keeps the fingerprint
		// it had before they existed.
		Approval        bool   `json:",omitempty"`
		ApprovalTimeout string `json:",omitempty"`
	}
	own := func(d budget.Duration) string {
		if followsDefault(d.Source) {
			return "turn"
		}
		return d.D.String() + " " + string(d.Source)
	}
	p := struct {
		Name, Instructions string
		Models             []string
		CompactAt          int
		Tools              []toolPrint
		// omitempty: an agent without notes keeps the fingerprint it
		// had before they existed.
		TimeNotes bool `json:",omitempty"`
	}{Name: a.name, Instructions: a.instructions, CompactAt: a.compactAt, TimeNotes: a.timeNotes}
	for _, m := range a.models {
		p.Models = append(p.Models, m.ProviderName+":"+m.Model+" "+m.Profile)
	}
	for _, n := range a.order {
		e := a.tools[n]
		tp := toolPrint{Name: e.spec.Name, Description: e.spec.Description, Kind: string(e.Tool.Tool.Kind()),
			Schema: compactJSON(e.spec.InputSchema), Timeout: own(e.Budget.Timeout), Idle: own(e.Budget.IdleTimeout),
			Enforcement: e.Budget.Enforcement, Retries: e.Retries}
		// A tool that never asks waits for no one: its approval timeout,
		// if any, changes nothing.
		if e.NeedsApproval != nil {
			tp.Approval = true
			if !e.ApprovalTimeout.Unset() && !followsDefault(e.ApprovalTimeout.Source) {
				tp.ApprovalTimeout = e.ApprovalTimeout.D.String() + " " + string(e.ApprovalTimeout.Source)
			}
		}
		p.Tools = append(p.Tools, tp)
	}
	b, _ := json.Marshal(p)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func compactJSON(r json.RawMessage) json.RawMessage {
	var v any
	if json.Unmarshal(r, &v) != nil {
		return r
	}
	b, _ := json.Marshal(v)
	return b
}
