package agent

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
	"github.com/timebox-run/timebox/model"
)

// ErrStopFollowing is the cause a server cancels the Run of a turn an
// engine's workers run with when the server shuts down: such a Run stops
// following the turn and returns its record as stored (running), leaving
// the turn to run on (a detached one outlives its gateway; one whose
// client was following it ends client_gone once the gateway is taken for
// gone). A Run of this process takes it as any cancellation.
var ErrStopFollowing = errors.New("the server following the turn is shutting down")

// Input is one turn's input.
type Input struct {
	// TurnID names the turn; a fresh one is made when empty.
	TurnID string
	// SessionID names the conversation the turn belongs to.
	SessionID string
	// History is the conversation so far (earlier turns' Messages).
	History []model.Message
	// Text is the user's message. Run sends it as it is, empty too (some
	// providers refuse an empty message: the turn then ends with their
	// error); `timebox run` and POST /v1/turns refuse an empty or blank
	// one before a turn begins, and a program taking text from people
	// should do the same.
	Text string
	// Approver decides on the calls of tools that need a person's
	// decision (Tool.NeedsApproval); nil denies them, saying that nobody
	// can decide.
	Approver Approver
	// Suspend, when closed, suspends the turn as soon as it waits for
	// nothing but people's decisions (a server stopping): Run returns
	// with Result.Suspended, from which Resume goes on later. A turn that
	// ends first ends as usual.
	Suspend <-chan struct{}
	// Budgets are this turn's own budgets, by knob name ("turn", "tool",
	// "step", "llm_budget", "max_steps", "max_tool_calls"); their source
	// is "request". Each may lower the agent's value, and raise it only up
	// to Config.RequestMax. Run leaves a value that Agent.TurnBudgets
	// refuses at the agent's value: call TurnBudgets first to report it.
	Budgets budget.Request
}

// Result is a finished turn.
type Result struct {
	// Record is the turn's durable record, with every call record and the
	// event log.
	Record *event.Turn
	// Messages are what the turn added to the conversation — the user's
	// message, the model's replies and the tool results — to be passed as
	// History to the next turn of the session.
	Messages []model.Message
	// Suspended, for a turn suspended while it waited for people
	// (Input.Suspend), is where Resume goes on from; Record and Messages
	// are then empty: the turn has not ended.
	Suspended *Checkpoint
}

// Run runs one turn and returns when it has ended (or was suspended,
// Input.Suspend). It never returns nil and never panics on bad model
// output; how the turn ended is in the record's Status, StopReason and
// Message.
//
// Cancelling ctx cancels the turn: give it a *budget.CancelError cause
// (context.WithCancelCause) to say why — cancelled, client_gone, shutdown;
// a bare cancellation reads as cancelled. When Run returns nothing it
// started is still running, apart from abandoned cooperative tool calls,
// which are counted by tool.AbandonedRunning.
//
// Events go to sinks in seq order, synchronously (see event.Sink).
func (a *Agent) Run(ctx context.Context, in Input, sinks ...event.Sink) *Result {
	s, tr := a.newState(in)
	traced, leave := a.traceTurn(ctx, s)
	t := a.resume(s, tr, in.Approver, sinks)
	res := a.drive(ctx, t, in)
	if res.Record != nil {
		traced(res)
	} else {
		// Suspended: the span is left unended, never exported; the
		// process that resumes the turn and ends it makes it (Resume).
		leave()
	}
	return res
}

// drive drives the turn t until it ends, or is suspended (Input.Suspend).
func (a *Agent) drive(ctx context.Context, t *turn, in Input) *Result {
	if in.Suspend != nil {
		t.susp = newSuspender(in.Suspend)
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-in.Suspend:
				t.susp.request()
			case <-done:
			}
		}()
	}
	var end machine.Unit
	t.under(ctx, func(ctx context.Context) {
		end = machine.Drive(&inProcess{t: t, ctx: ctx}, t.s)
	})
	if end.Kind == machine.Suspend {
		return &Result{Suspended: t.checkpoint()}
	}
	return t.finish(*end.End)
}

// newState makes the state of a turn that begins now, and its transcript:
// its budgets (the agent's, with the request's), its id, its repaired
// history and the user's message.
func (a *Agent) newState(in Input) (*machine.State, *memTranscript) {
	s := &machine.State{TurnID: in.TurnID, SessionID: in.SessionID, Start: time.Now()}
	s.Budgets, s.Limits = a.requestBudgets(in.Budgets)
	if s.TurnID == "" {
		s.TurnID = NewTurnID()
	}
	tr := &memTranscript{text: in.Text}
	// The session's last compaction is where this turn starts from.
	h, summary, covers := SplitSummary(in.History)
	// A history cut by a crash would be refused by the providers.
	tr.history, s.Repaired = RepairHistory(h)
	if summary != "" {
		tr.summary, s.Summarised, s.CompactedUpTo = summary, true, min(covers, len(tr.history))
	}
	tr.Put(0, model.Message{Role: model.RoleUser, Content: in.Text})
	s.Messages = 1
	return s, tr
}

// resume makes the in-process turn of s: the one for a whole Run, or for
// the units an engine runs here one at a time.
func (a *Agent) resume(s *machine.State, tr machine.Transcript, approver Approver, sinks []event.Sink) *turn {
	t := &turn{a: a, s: s, tr: tr, sinks: sinks, approver: approver}
	for _, k := range sinks {
		if rs, ok := k.(event.ReportSink); ok {
			t.reporters = append(t.reporters, rs)
		}
	}
	if a.tracer != nil {
		// The spans are told last: a sink that stores an event before the
		// turn goes on (a Temporal unit's) may learn from its store that
		// another ended the turn meanwhile, and then disowns the unit's
		// account of its calls (event.Disowner), spans included.
		t.spans = newSpans(t, a.tracer)
		sinks = append(slices.Clip(sinks), t.spans)
	}
	t.emSinks = sinks
	t.em = event.NewEmitter(s.TurnID, sinks...)
	a.resumeProviders(t.conversationID(), s.Providers)
	return t
}

// under runs work under the turn's watchdogs: the step watchdog and its
// still_working notices, the turn's ceiling (counted from the turn's
// start), and ctx's cancellation. work's context is detached from ctx and
// cancelled by hand when ctx ends, so that what was running is noted
// before the cancellation reaches the tools.
func (t *turn) under(ctx context.Context, work func(context.Context)) {
	turnCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	b := &t.s.Budgets
	t.live = newLiveness(b.Step, b.ProgressNotice.D, t.s.LastProgress,
		func(v event.Payload) { t.em.Emit(v) },
		func(te *budget.TimeoutError) { t.stopWith(cancel, te) })
	t.ceiling = newCeiling(t.s.Ceiling(), func(waited time.Duration) {
		t.stopWith(cancel, b.Turn.Expired(budget.PhaseTurn, "the turn", time.Since(t.s.Start)-waited))
	})
	stopWatch := context.AfterFunc(ctx, func() { t.stopWith(cancel, budget.Cause(ctx)) })

	work(turnCtx)

	t.ceiling.stop()
	stopWatch()
	t.live.close()
	t.s.LastProgress = t.live.lastProgressed()
}

// turn is a turn in this process: its state (machine.State), its
// transcript, and what a unit of work needs while it runs — the emitter,
// the watchdogs, the call records. Run keeps one for the whole turn; an
// engine that runs each unit elsewhere makes one per unit (resume).
type turn struct {
	a  *Agent
	s  *machine.State
	tr machine.Transcript
	em *event.Emitter
	// live is the watchdog of what runs under (under).
	live *liveness
	// spans traces the calls; nil when the agent is not traced.
	spans *spans
	// sinks are the run's sinks; those that are event.LateSinks get the
	// late results that arrive after the turn ended.
	sinks []event.Sink
	// reporters are the sinks that are told of every progress report
	// (event.ReportSink): none but a Temporal unit's, so that a flood of
	// reports costs the others nothing.
	reporters []event.ReportSink
	// approver decides on calls that need a person (Input.Approver).
	approver Approver
	// ceiling is the timer of the turn's ceiling, which waits for people
	// stop (under, Paused).
	ceiling *ceiling
	// susp suspends the turn when it waits for nothing but people and
	// Input.Suspend is closed; nil when it cannot be suspended.
	susp *suspender
	// emSinks are the emitter's sinks, for a resumed turn's emitter.
	emSinks []event.Sink
	// noModel: the calls' results go to a person, not a model
	// (CallTool), so they carry no time notes.
	noModel bool

	stopNote // written once, by capture, under its sync.Once
	records  // shared with the tool calls' goroutines, under records.mu
}

// stopNote is what the turn was doing when a turn-level budget or a
// cancellation stopped it: written once, from the timer or watchdog that
// stopped it, under stopOnce; read by finish after stopOnce.Do.
type stopNote struct {
	stopOnce sync.Once
	captured bool
	stopSnap stopSnap
}

// records are the turn's call records, which tool calls write from their
// own goroutines and late results after the turn ended; mu guards them.
type records struct {
	mu        sync.Mutex
	toolRecs  []event.ToolCall
	modelRecs []event.ModelCall
	ended     bool
	// pendingLate holds late results that arrived before their call's
	// record was written.
	pendingLate map[string]lateResult
	// waits are the liveness activities of the calls waiting for a
	// person, by call id.
	waits map[string]*activity
}

// stopWith cancels the turn for cause, first noting what was running.
func (t *turn) stopWith(cancel context.CancelCauseFunc, cause error) {
	t.capture()
	cancel(cause)
}

// capture notes, once, what the turn was doing when it was stopped.
func (t *turn) capture() {
	t.stopOnce.Do(func() {
		t.stopSnap, t.captured = t.live.freeze(time.Now()), true
	})
}

// note returns what the turn was doing when it was stopped, nil if it was
// not: the snapshot capture took, put in words here, on the turn's
// goroutine.
func (t *turn) note() *machine.StopNote {
	t.stopOnce.Do(func() {}) // a capture under way has finished
	if !t.captured {
		return nil
	}
	return t.stopSnap.note()
}

// stopped is the note of what the turn was doing when it was stopped:
// this turn's own (capture), or else the one the state carries from the
// units that ran elsewhere.
func (t *turn) stopped() *machine.StopNote {
	if n := t.note(); n != nil {
		return n
	}
	return t.s.Stopped
}

func (t *turn) started() *event.TurnStarted {
	a := t.a
	b := map[string]event.BudgetValue{}
	for _, k := range budget.Knobs {
		v := k.Value(&t.s.Budgets, &t.s.Limits)
		v.Key = "" // the map's key
		b[k.Key] = v
	}
	tools := map[string]event.ToolBudgetSummary{}
	for _, n := range a.order {
		tb := t.toolBudget(a.tools[n])
		tools[n] = event.ToolBudgetSummary{TimeoutMS: tb.Timeout.MS(), Source: tb.Timeout.Source,
			IdleTimeoutMS: tb.IdleTimeout.MS(), Enforcement: tb.Enforcement}
	}
	return &event.TurnStarted{SessionID: t.s.SessionID, Agent: a.name, Input: t.tr.Input(),
		Model: a.models[0].Name(), Budgets: b, Tools: tools, HistoryRepaired: t.s.Repaired,
		Traceparent: t.s.TraceParent, CallerTraceparent: t.s.TraceCaller}
}

// toolBudget returns the budget of a tool's calls in this turn: the tool's
// own, or, where the tool follows the turn's defaults (timeouts.tool and
// timeouts.kill_grace), the turn's — which a request, and a runner's flags
// on another engine, may have set.
func (t *turn) toolBudget(e *entry) budget.ToolBudget {
	return turnToolBudget(e, &t.s.Budgets)
}

func turnToolBudget(e *entry, tb *budget.Budgets) budget.ToolBudget {
	b := e.Budget
	if followsDefault(b.Timeout.Source) {
		b.Timeout = tb.Tool
	}
	if followsDefault(b.KillGrace.Source) {
		b.KillGrace = tb.KillGrace
	}
	return b
}

// followsDefault reports whether a tool budget with this source is the
// turn's default rather than the tool's own.
func followsDefault(s budget.Source) bool {
	switch s {
	case budget.SourceFlag, budget.SourceEnv, budget.SourceFile, budget.SourceDefault, budget.SourceRequest:
		return true
	}
	return false
}

func (t *turn) request() model.Request {
	defs := make([]model.ToolDef, 0, len(t.a.order))
	for _, n := range t.a.order {
		e := t.a.tools[n]
		desc := e.spec.Description
		if t.a.timeNotes {
			desc = withNote(desc, toolBudgetNote(t.toolBudget(e)))
		}
		defs = append(defs, model.ToolDef{Name: e.spec.Name, Description: desc, Parameters: e.spec.InputSchema})
	}
	msgs := t.sendable(t.conversation()[t.s.CompactedUpTo:])
	system := t.a.instructions
	if t.s.Summarised {
		system += "\n\n" + summaryHeading + "\n" + t.tr.Summary()
	}
	req := model.Request{System: system, Messages: msgs, Tools: defs, Conversation: t.conversationID()}
	if t.a.timeNotes {
		req.TimeNote = t.timeNote(time.Now())
	}
	return req
}

// sessionMessages are what the turn that ended as end adds to its
// session's history: its messages; the reply it was streaming when it was
// stopped, as far as it got, said to be cut off (the record keeps it as
// the partial answer; the next turn's model is told it too, so that
// "go on" has something to go on from); then, when it compacted the
// conversation, the note of the summary the next turn starts from
// (SplitSummary).
func (t *turn) sessionMessages(end machine.Ending) []model.Message {
	msgs := t.tr.Messages()
	if p := t.tr.Partial(); end.Reason != budget.Answered && strings.TrimSpace(p) != "" &&
		(len(msgs) == 0 || msgs[len(msgs)-1].Role != model.RoleAssistant || msgs[len(msgs)-1].Content != p) {
		msgs = append(slices.Clip(msgs), model.Message{Role: model.RoleAssistant,
			Content: p + "\n[timebox: the reply was cut off here: the turn was stopped (" + string(end.Reason) + ")]"})
	}
	if t.s.SummarisedHere {
		msgs = append(slices.Clip(msgs), model.Message{Role: model.RoleSummary, Content: t.tr.Summary(), Covers: t.s.CompactedUpTo})
	}
	return msgs
}

// conversationID is the conversation the turn's model requests name.
func (t *turn) conversationID() string {
	if t.s.SessionID != "" {
		return t.s.SessionID
	}
	return t.s.TurnID
}

// finish ends the turn as end says: the turn_finished event and the
// record.
func (t *turn) finish(end machine.Ending) *Result {
	s := t.s
	if !s.Begun {
		t.em.Emit(t.started())
		s.Begun = true
	}
	// Wait for a capture under way (Once.Do returns only after it); after
	// this none can start.
	note := t.stopped()
	now := time.Now()
	var answer string
	switch {
	case end.Reason == budget.Answered:
		answer = t.tr.Message(s.Messages - 1).Content
	default:
		answer = t.tr.Partial()
	}
	flags := stopFlags(s, end, note)
	msg := t.message(end, note, now)
	if tools, models, ok := t.tr.Records(); ok {
		// The units ran elsewhere: their records, this one's too, are in
		// the transcript's store.
		t.mu.Lock()
		t.toolRecs, t.modelRecs = tools, models
		t.mu.Unlock()
	}
	// From here on a late result goes to the sinks' LateResult, not to
	// events.
	t.mu.Lock()
	t.ended = true
	rec := &event.Turn{
		TurnID: s.TurnID, SessionID: s.SessionID, Agent: t.a.name, Input: t.tr.Input(),
		Status: end.Reason.Status(), StopReason: end.Reason, Message: msg, Answer: answer, Flags: flags,
		StartedAt: s.Start, EndedAt: now, Steps: s.Steps, LLMMS: s.LLMUsed.Milliseconds(), ToolMS: s.ToolTime.Milliseconds(),
		WallMS: now.Sub(s.Start).Milliseconds(), ApprovalMS: s.ApprovalWait.Milliseconds(), Failovers: s.Failovers,
		ToolCalls:  append([]event.ToolCall(nil), t.toolRecs...),
		ModelCalls: append([]event.ModelCall(nil), t.modelRecs...),
	}
	t.mu.Unlock()
	// slices, not sort.SliceStable: no reflection, no allocation, in a
	// wind-down of thousands of turns at once.
	slices.SortStableFunc(rec.ToolCalls, func(x, y event.ToolCall) int { return x.StartedAt.Compare(y.StartedAt) })
	t.em.Emit(&event.TurnFinished{Status: rec.Status, StopReason: rec.StopReason, Message: rec.Message,
		Answer: rec.Answer, Flags: flags, Totals: rec.Totals(), Limit: t.limit(end)})
	t.em.Close()
	rec.Events = t.em.Log()
	s.Finished, s.End = true, &end
	return &Result{Record: rec, Messages: t.sessionMessages(end)}
}
