package agent

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
)

// Input is one turn's input.
type Input struct {
	// TurnID names the turn; a fresh one is made when empty.
	TurnID string
	// SessionID names the conversation the turn belongs to.
	SessionID string
	// History is the conversation so far (earlier turns' Messages).
	History []model.Message
	// Text is the user's message.
	Text string
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
}

// Run runs one turn and returns when it has ended. It never returns nil and
// never panics on bad model output; how the turn ended is in the record's
// Status, StopReason and Message.
//
// Cancelling ctx cancels the turn: give it a *budget.CancelError cause
// (context.WithCancelCause) to say why — cancelled, client_gone, shutdown;
// a bare cancellation reads as cancelled. When Run returns nothing it
// started is still running, apart from abandoned cooperative tool calls,
// which are counted by tool.AbandonedRunning.
//
// Events go to sinks in seq order, synchronously (see event.Sink).
func (a *Agent) Run(ctx context.Context, in Input, sinks ...event.Sink) *Result {
	t := a.newTurn(in, sinks)
	t.em.Emit(t.started())
	var st stop
	t.under(ctx, func(ctx context.Context) { st = t.loop(ctx) })
	return t.finish(st)
}

// newTurn makes the state of a turn that begins now: its budgets (the
// agent's, with the request's), its id and its repaired history.
func (a *Agent) newTurn(in Input, sinks []event.Sink) *turn {
	t := &turn{a: a, in: in, id: in.TurnID, start: time.Now()}
	t.b, t.l = a.requestBudgets(in.Budgets)
	if t.id == "" {
		t.id = NewTurnID()
	}
	t.in.TurnID = t.id
	t.em, t.sinks = event.NewEmitter(t.id, sinks...), sinks
	// A history cut by a crash would be refused by the providers.
	t.in.History, t.repaired = RepairHistory(in.History)
	t.msgs = append(t.msgs, model.Message{Role: model.RoleUser, Content: t.in.Text})
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
	t.live = newLiveness(t.b.Step, t.b.ProgressNotice.D,
		func(v event.Payload) { t.em.Emit(v) },
		func(te *budget.TimeoutError) { t.stopWith(cancel, te) })
	ceiling := time.AfterFunc(t.b.Turn.D-time.Since(t.start), func() {
		t.stopWith(cancel, t.b.Turn.Expired(budget.PhaseTurn, "the turn", time.Since(t.start)))
	})
	stopWatch := context.AfterFunc(ctx, func() { t.stopWith(cancel, budget.Cause(ctx)) })

	work(turnCtx)

	ceiling.Stop()
	stopWatch()
	t.live.close()
}

// turn is the state of one Run.
type turn struct {
	a     *Agent
	in    Input
	id    string
	start time.Time
	em    *event.Emitter
	live  *liveness
	// sinks are the run's sinks; those that are event.LateSinks get the
	// late results that arrive after the turn ended.
	sinks []event.Sink
	// b and l are the turn's budgets: the agent's, with the request's.
	b budget.Budgets
	l budget.Limits

	// repaired counts the history messages RepairHistory added or dropped.
	repaired int

	stopNote  // written once, by capture, under its sync.Once
	records   // shared with the tool calls' goroutines, under records.mu
	loopState // owned by the loop goroutine
}

// stopNote is what the turn was doing when a turn-level budget or a
// cancellation stopped it: written once, from the timer or watchdog that
// stopped it, under stopOnce; read by finish after stopOnce.Do.
type stopNote struct {
	stopOnce          sync.Once
	stopDesc          string
	stopTools         []string
	stopDuringRun     bool
	stopDuringCompact bool
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
}

// loopState is owned by the loop goroutine (and read by finish after the
// loop returned).
type loopState struct {
	msgs       []model.Message
	steps      int
	toolCalls  int
	llmUsed    time.Duration
	toolTime   time.Duration
	idleStreak int
	failovers  int
	partial    string
	lastStep   string
	lastModel  string

	// History compaction: the summary of the first compactedUpTo messages
	// of the conversation, which requests send instead of them.
	summary           string
	compactedUpTo     int
	compactionFailed  error
	compactionTimeout bool
	// insufficient: the last compaction left the conversation over
	// compact_at; retryAt: no compaction before the estimate reaches it.
	insufficient bool
	retryAt      int
}

// stop is how the loop ended.
type stop struct {
	reason  budget.StopReason
	cause   error
	answer  string
	message string
	// notes are the failed attempts of the last model step, when every
	// link of the chain failed.
	notes []attemptNote
}

// stopWith cancels the turn for cause, first noting what was running.
func (t *turn) stopWith(cancel context.CancelCauseFunc, cause error) {
	t.capture()
	cancel(cause)
}

// capture notes, once, what the turn was doing when it was stopped.
func (t *turn) capture() {
	t.stopOnce.Do(func() {
		t.stopDesc, t.stopTools = t.live.describe(time.Now())
		t.stopDuringRun = len(t.stopTools) > 0
		t.stopDuringCompact = t.live.compacting()
	})
}

func (t *turn) started() *event.TurnStarted {
	a := t.a
	b := map[string]event.BudgetValue{}
	for _, k := range budget.Knobs {
		v := k.Value(&t.b, &t.l)
		v.Key = "" // the map's key
		b[k.Key] = v
	}
	tools := map[string]event.ToolBudgetSummary{}
	for _, n := range a.order {
		tb := t.toolBudget(a.tools[n])
		tools[n] = event.ToolBudgetSummary{TimeoutMS: tb.Timeout.MS(), Source: tb.Timeout.Source,
			IdleTimeoutMS: tb.IdleTimeout.MS(), Enforcement: tb.Enforcement}
	}
	return &event.TurnStarted{SessionID: t.in.SessionID, Agent: a.name, Input: t.in.Text,
		Model: a.models[0].Name(), Budgets: b, Tools: tools, HistoryRepaired: t.repaired}
}

// toolBudget returns the budget of a tool's calls in this turn: the tool's
// own, or the turn's tool default when the tool has none of its own and
// the request set one.
func (t *turn) toolBudget(e *entry) budget.ToolBudget {
	b := e.Budget
	if t.b.Tool.Source == budget.SourceRequest && followsDefault(b.Timeout.Source) {
		b.Timeout = t.b.Tool
	}
	return b
}

// followsDefault reports whether a tool timeout with this source is the
// process-wide timeouts.tool rather than the tool's own.
func followsDefault(s budget.Source) bool {
	switch s {
	case budget.SourceFlag, budget.SourceEnv, budget.SourceFile, budget.SourceDefault:
		return true
	}
	return false
}

func (t *turn) loop(ctx context.Context) stop {
	for {
		calls, st := t.think(ctx)
		if st != nil {
			return *st
		}
		results, refused := t.toolStep(ctx, t.steps, calls)
		t.heard(calls, results)
		if st := t.afterTools(ctx, refused); st != nil {
			return *st
		}
	}
}

// think makes the turn's next model step — the step checks, compaction,
// the model call with its failover — and returns the tool calls the model
// asked for, or how the turn ends: an answer or a stop.
func (t *turn) think(ctx context.Context) ([]model.ToolCall, *stop) {
	for {
		if ctx.Err() != nil {
			st := t.stopFromContext(ctx)
			return nil, &st
		}
		if int64(t.steps) >= t.l.MaxSteps.N {
			return nil, &stop{reason: budget.MaxSteps}
		}
		if lb := t.b.LLMBudget; !lb.Off() && t.llmUsed >= lb.D {
			return nil, &stop{reason: budget.LLMBudgetExhausted}
		}
		if _, st := t.compact(ctx, t.steps+1, false); st != nil {
			return nil, st
		}
		t.steps++
		resp, st := t.modelStep(ctx, t.steps)
		if st != nil {
			if st = t.tooLong(ctx, st); st == nil {
				continue // compacted after a length refusal: make the step again
			}
			return nil, st
		}
		t.msgs = append(t.msgs, model.Message{Role: model.RoleAssistant, Content: resp.Text, ToolCalls: resp.ToolCalls})
		if len(resp.ToolCalls) == 0 {
			return nil, &stop{reason: budget.Answered, answer: resp.Text}
		}
		return resp.ToolCalls, nil
	}
}

// heard adds the results of a batch of tool calls to the conversation.
func (t *turn) heard(calls []model.ToolCall, results []string) {
	t.msgs = append(t.msgs, toolMessages(calls, results)...)
}

func toolMessages(calls []model.ToolCall, results []string) []model.Message {
	out := make([]model.Message, len(calls))
	for i, c := range calls {
		out[i] = model.Message{Role: model.RoleTool, Content: results[i], ToolCallID: c.ID, ToolName: c.Name}
	}
	return out
}

// afterTools returns how the turn ends after a batch of tool calls, if it
// does: stopped meanwhile, or past max_tool_calls.
func (t *turn) afterTools(ctx context.Context, refused int) *stop {
	if ctx.Err() != nil {
		st := t.stopFromContext(ctx)
		return &st
	}
	if refused > 0 {
		return &stop{reason: budget.MaxToolCalls, message: refusedText(refused)}
	}
	return nil
}

func refusedText(n int) string { return fmt.Sprintf("%d more asked for were not run. ", n) }

// stopFromContext turns the cause of the turn context's end into a stop.
func (t *turn) stopFromContext(ctx context.Context) stop {
	cause := budget.Cause(ctx)
	if te, ok := budget.AsTimeout(cause); ok {
		switch te.Phase {
		case budget.PhaseStep:
			return stop{reason: budget.NoProgress, cause: cause}
		case budget.PhaseLLMBudget:
			return stop{reason: budget.LLMBudgetExhausted, cause: cause}
		}
		return stop{reason: budget.TurnTimeout, cause: cause}
	}
	if ce, ok := budget.AsCancel(cause); ok {
		return stop{reason: ce.Reason, cause: cause}
	}
	return stop{reason: budget.Cancelled, cause: cause}
}

func (t *turn) request() model.Request {
	defs := make([]model.ToolDef, 0, len(t.a.order))
	for _, n := range t.a.order {
		e := t.a.tools[n]
		defs = append(defs, model.ToolDef{Name: e.spec.Name, Description: e.spec.Description, Parameters: e.spec.InputSchema})
	}
	conv := t.in.SessionID
	if conv == "" {
		conv = t.id
	}
	msgs := t.sendable(t.conversation()[t.compactedUpTo:])
	system := t.a.instructions
	if t.summary != "" {
		system += "\n\n" + summaryHeading + "\n" + t.summary
	}
	return model.Request{System: system, Messages: msgs, Tools: defs, Conversation: conv}
}

// finish closes the turn: the turn_finished event and the record.
func (t *turn) finish(st stop) *Result {
	// Wait for a capture under way (Once.Do returns only after it); after
	// this none can start.
	t.stopOnce.Do(func() {})
	now := time.Now()
	if st.reason != budget.Answered && st.answer == "" {
		st.answer = t.partial
	}
	flags := event.Flags{}
	if te, ok := budget.AsTimeout(st.cause); ok && (te.Phase == budget.PhaseTurn || te.Phase == budget.PhaseStep) {
		flags.TimedOutByTurnBudget = te.Phase == budget.PhaseTurn
		flags.TimedOutDuringToolExecution = t.stopDuringRun
		flags.TimedOutDuringCompaction = t.stopDuringCompact
	}
	if t.compactionTimeout {
		flags.TimedOutDuringCompaction = true
	}
	msg := t.message(st, now)
	// From here on a late result goes to the sinks' LateResult, not to
	// events.
	t.mu.Lock()
	t.ended = true
	rec := &event.Turn{
		TurnID: t.id, SessionID: t.in.SessionID, Agent: t.a.name, Input: t.in.Text,
		Status: st.reason.Status(), StopReason: st.reason, Message: msg, Answer: st.answer, Flags: flags,
		StartedAt: t.start, EndedAt: now, Steps: t.steps, LLMMS: t.llmUsed.Milliseconds(), ToolMS: t.toolTime.Milliseconds(),
		WallMS: now.Sub(t.start).Milliseconds(), Failovers: t.failovers,
		ToolCalls:  append([]event.ToolCall(nil), t.toolRecs...),
		ModelCalls: append([]event.ModelCall(nil), t.modelRecs...),
	}
	t.mu.Unlock()
	sort.SliceStable(rec.ToolCalls, func(i, j int) bool { return rec.ToolCalls[i].StartedAt.Before(rec.ToolCalls[j].StartedAt) })
	t.em.Emit(&event.TurnFinished{Status: rec.Status, StopReason: rec.StopReason, Message: rec.Message,
		Answer: rec.Answer, Flags: flags, Totals: rec.Totals(), Limit: t.limit(st)})
	t.em.Close()
	rec.Events = t.em.Log()
	return &Result{Record: rec, Messages: t.msgs}
}
