package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/tool"
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
	t := &turn{a: a, in: in, id: in.TurnID, start: time.Now()}
	t.b, t.l = a.requestBudgets(in.Budgets)
	if t.id == "" {
		t.id = NewTurnID()
	}
	t.em, t.sinks = event.NewEmitter(t.id, sinks...), sinks
	// A history cut by a crash would be refused by the providers.
	t.in.History, t.repaired = RepairHistory(in.History)
	// The turn's context is detached from ctx and cancelled by hand when
	// ctx ends, so that what was running is noted before the cancellation
	// reaches the tools.
	turnCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)

	t.em.Emit(t.started())
	t.live = newLiveness(t.b.Step, t.b.ProgressNotice.D,
		func(v event.Payload) { t.em.Emit(v) },
		func(te *budget.TimeoutError) { t.stopWith(cancel, te) })
	ceiling := time.AfterFunc(t.b.Turn.D, func() {
		t.stopWith(cancel, t.b.Turn.Expired(budget.PhaseTurn, "the turn", time.Since(t.start)))
	})
	stopWatch := context.AfterFunc(ctx, func() { t.stopWith(cancel, budget.Cause(ctx)) })

	st := t.loop(turnCtx)

	ceiling.Stop()
	stopWatch()
	t.live.close()
	return t.finish(st)
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

	// Set once, when a turn-level budget or a cancellation stops the turn.
	stopOnce          sync.Once
	stopDesc          string
	stopTools         []string
	stopDuringRun     bool
	stopDuringCompact bool

	mu        sync.Mutex
	toolRecs  []event.ToolCall
	modelRecs []event.ModelCall
	ended     bool
	// pendingLate holds late results that arrived before their call's
	// record was written.
	pendingLate map[string]lateResult

	// Owned by the loop goroutine.
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

	// repaired counts the history messages RepairHistory added or dropped.
	repaired int
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
	t.msgs = append(t.msgs, model.Message{Role: model.RoleUser, Content: t.in.Text})
	for {
		if ctx.Err() != nil {
			return t.stopFromContext(ctx)
		}
		if int64(t.steps) >= t.l.MaxSteps.N {
			return stop{reason: budget.MaxSteps}
		}
		if lb := t.b.LLMBudget; !lb.Off() && t.llmUsed >= lb.D {
			return stop{reason: budget.LLMBudgetExhausted}
		}
		if _, st := t.compact(ctx, t.steps+1, false); st != nil {
			return *st
		}
		t.steps++
		resp, st := t.modelStep(ctx, t.steps)
		if st != nil {
			if st = t.tooLong(ctx, st); st == nil {
				continue // compacted after a length refusal: make the step again
			}
			return *st
		}
		t.msgs = append(t.msgs, model.Message{Role: model.RoleAssistant, Content: resp.Text, ToolCalls: resp.ToolCalls})
		if len(resp.ToolCalls) == 0 {
			return stop{reason: budget.Answered, answer: resp.Text}
		}
		results, refused := t.toolStep(ctx, t.steps, resp.ToolCalls)
		for i, c := range resp.ToolCalls {
			t.msgs = append(t.msgs, model.Message{Role: model.RoleTool, Content: results[i], ToolCallID: c.ID, ToolName: c.Name})
		}
		if ctx.Err() != nil {
			return t.stopFromContext(ctx)
		}
		if refused > 0 {
			return stop{reason: budget.MaxToolCalls, message: fmt.Sprintf("%d more asked for were not run. ", refused)}
		}
	}
}

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

// attemptNote is one failed model call attempt, for messages.
type attemptNote struct {
	endpoint string
	profile  string
	err      error
	index    int       // the endpoint's place in the chain
	at       time.Time // when it failed
}

// modelStep makes one model call, failing over along the chain on LLM-phase
// failures (spec §6). When every link has failed and one of them was rate
// limited with a Retry-After that ends inside the turn's remaining time,
// that link is tried once more after waiting it out.
func (t *turn) modelStep(ctx context.Context, step int) (model.Response, *stop) {
	req := t.request()
	var notes []attemptNote
	tries := make([]int, len(t.a.models))
	for i := range tries {
		tries[i] = i
	}
	retried, askedAgain := false, false
	for k := 0; k < len(tries); k++ {
		i := tries[k]
		ep := t.a.models[i]
		req.Model = ep.Model
		resp, err := t.attempt(ctx, step, k+1, ep, req)
		if err == nil {
			t.idleStreak = 0
			return resp, nil
		}
		if ctx.Err() != nil {
			st := t.stopFromContext(ctx)
			return model.Response{}, &st
		}
		phase := model.Phase(err)
		if phase == budget.PhaseLLMBudget {
			return model.Response{}, &stop{reason: budget.LLMBudgetExhausted, cause: err}
		}
		if phase == budget.PhaseLLMReplyCap {
			// No failover: another model given the same prompt would most
			// likely write on as long (docs/decisions/reply-cap.md).
			return model.Response{}, &stop{reason: budget.ReplyTooLong, cause: err}
		}
		var me *model.Error
		if errors.As(err, &me) && me.Rejected() {
			return model.Response{}, &stop{reason: budget.ModelRejected, cause: err}
		}
		notes = append(notes, attemptNote{endpoint: ep.Name(), profile: ep.Profile, err: err, index: i, at: time.Now()})
		if phase == budget.PhaseLLMIdle || phase == budget.PhaseLLMFirstChunk {
			t.idleStreak++
			if int64(t.idleStreak) >= t.l.IdleBreaker.N {
				return model.Response{}, &stop{reason: budget.ModelUnresponsive, cause: err, message: notesText(notes)}
			}
		}
		// An empty reply is asked again once, of the same endpoint, before
		// the chain moves on — unless the model spent its whole output
		// allowance, which asking again would only repeat
		// (docs/decisions/empty-reply.md).
		var ee *model.EmptyReplyError
		if errors.As(err, &ee) && !askedAgain && !ee.OutOfTokens() {
			askedAgain = true
			tries = slices.Insert(tries, k+1, i)
		}
		if k+1 == len(tries) && !retried {
			if n, wait, ok := t.retryCandidate(notes); ok {
				retried = true
				tries = append(tries, notes[n].index)
				next := t.a.models[notes[n].index]
				t.failovers++
				t.em.Emit(&event.Failover{Step: step, From: endpointLabel(ep), To: endpointLabel(next), Phase: phase,
					Reason:  fmt.Sprintf("%v; every link failed, retrying %s after its Retry-After (%s)", err, endpointLabel(next), roundHuman(wait)),
					Attempt: k + 2})
				if st := t.waitRetry(ctx, step, next, wait); st != nil {
					return model.Response{}, st
				}
				continue
			}
		}
		if k+1 < len(tries) {
			next := t.a.models[tries[k+1]]
			reason := err.Error()
			if tries[k+1] == i {
				reason += "; asking the same model once more"
			}
			t.failovers++
			t.em.Emit(&event.Failover{Step: step, From: endpointLabel(ep), To: endpointLabel(next), Phase: phase,
				Reason: reason, Attempt: k + 2})
		}
	}
	return model.Response{}, &stop{reason: budget.ModelUnavailable, cause: notes[len(notes)-1].err, message: notesText(notes), notes: notes}
}

// retryCandidate returns the failed attempt whose Retry-After ends first,
// and how long is left to wait for it, if that ends inside the turn's
// remaining time and inside the step window (so waiting it out is not
// mistaken for a stuck turn).
func (t *turn) retryCandidate(notes []attemptNote) (int, time.Duration, bool) {
	best, bestWait := -1, time.Duration(0)
	now := time.Now()
	for n, note := range notes {
		var me *model.Error
		if !errors.As(note.err, &me) || me.RetryAfter <= 0 {
			continue
		}
		wait := max(note.at.Add(me.RetryAfter).Sub(now), 0)
		if best < 0 || wait < bestWait {
			best, bestWait = n, wait
		}
	}
	if best < 0 {
		return 0, 0, false
	}
	remaining := t.b.Turn.D - now.Sub(t.start)
	if bestWait >= remaining {
		return 0, 0, false
	}
	if s := t.b.Step; !s.Off() && bestWait >= s.D {
		return 0, 0, false
	}
	return best, bestWait, true
}

// waitRetry waits out a Retry-After. The wait is an activity with a
// deadline, so the step watchdog counts it as alive.
func (t *turn) waitRetry(ctx context.Context, step int, ep model.Endpoint, wait time.Duration) *stop {
	act := &activity{step: step, subject: "model " + ep.Model + " (waiting out its Retry-After)", deadline: time.Now().Add(wait)}
	t.live.begin(act)
	defer t.live.end(act, false)
	tm := time.NewTimer(wait)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		st := t.stopFromContext(ctx)
		return &st
	}
}

func endpointLabel(ep model.Endpoint) string {
	if ep.Profile == "" {
		return ep.Name()
	}
	return ep.Name() + " (" + ep.Profile + ")"
}

// attempt makes one model call attempt under the watchdogs and the turn's
// llm_budget.
func (t *turn) attempt(ctx context.Context, step, attempt int, ep model.Endpoint, req model.Request) (model.Response, error) {
	b := t.b
	t.em.Emit(&event.LLMStarted{Step: step, Model: ep.Model, Provider: ep.ProviderName, Profile: ep.Profile, Attempt: attempt})
	act := &activity{step: step, subject: "model " + ep.Model}
	t.lastStep, t.lastModel = act.subject, ep.Model
	t.live.begin(act)

	callCtx, cancelCall := context.WithCancelCause(ctx)
	defer cancelCall(nil)
	if !b.LLMBudget.Off() {
		remaining := b.LLMBudget.D - t.llmUsed
		used := t.llmUsed
		timer := time.AfterFunc(remaining, func() {
			cancelCall(b.LLMBudget.Expired(budget.PhaseLLMBudget, "model streaming in this turn", used+remaining))
		})
		defer timer.Stop()
	}
	w := model.Open(callCtx, ep.Provider, req, t.watchdog(), "model "+ep.Model)
	var text strings.Builder
	var delta []byte
	var err error
	for {
		var c model.Chunk
		c, err = w.Recv()
		if err != nil {
			break
		}
		if w.FirstChunk() > 0 && !act.streaming {
			t.live.streaming(act)
		}
		t.live.progress()
		// Events go to the sinks synchronously. When they are slower than
		// the provider, what has arrived meanwhile goes as one llm_delta,
		// so that the number of events follows the sinks' pace, not the
		// provider's, and a flood of tiny chunks is not a flood of events.
		delta = append(delta[:0], c.Text...)
		for len(delta) < maxDelta {
			more, ok := w.Ready()
			if !ok {
				break
			}
			delta = append(delta, more.Text...)
		}
		if len(delta) > 0 {
			d := string(delta)
			text.WriteString(d)
			t.em.Emit(&event.LLMDelta{Step: step, Text: d})
		}
	}
	w.Close()
	elapsed := time.Since(w.Started())
	t.llmUsed += elapsed
	var resp model.Response
	if err == io.EOF {
		err = nil
		resp = w.Response()
		if resp.Text == "" {
			resp.Text = text.String()
		}
		if resp.Empty() {
			err = &model.EmptyReplyError{Provider: ep.ProviderName, FinishReason: resp.FinishReason}
			resp = model.Response{}
		}
	}
	t.partial = text.String()
	t.live.end(act, err == nil)

	rec := event.ModelCall{Step: step, Model: ep.Model, Provider: ep.ProviderName, Profile: ep.Profile, Attempt: attempt,
		StartedAt: w.Started(), FirstChunkMS: w.FirstChunk().Milliseconds(), StreamMS: elapsed.Milliseconds(), Outcome: event.OutcomeOK}
	if err != nil {
		rec.Outcome, rec.Phase, rec.Error = modelOutcome(err), model.Phase(err), err.Error()
	}
	t.mu.Lock()
	t.modelRecs = append(t.modelRecs, rec)
	t.mu.Unlock()
	t.em.Emit(&event.LLMFinished{ModelCall: rec, ToolCalls: len(resp.ToolCalls)})
	return resp, err
}

// maxDelta is the most text the turn gathers into one llm_delta from chunks
// that are already waiting; a single larger chunk still goes whole.
const maxDelta = 64 << 10

// watchdog returns the budgets every model stream of the turn runs under.
func (t *turn) watchdog() model.Watchdog {
	b := t.b
	return model.Watchdog{FirstChunk: b.LLMFirstChunk, Idle: b.LLMIdle, MaxReply: t.l.MaxReply}
}

func modelOutcome(err error) event.Outcome {
	switch model.Phase(err) {
	case budget.PhaseLLMFirstChunk, budget.PhaseLLMIdle, budget.PhaseLLMBudget, budget.PhaseTurn, budget.PhaseStep, budget.PhaseCompaction:
		return event.OutcomeTimedOut
	case budget.PhaseCancel:
		return event.OutcomeCancelled
	}
	return event.OutcomeError
}

// toolStep runs one batch of tool calls, up to parallel_tools at once, and
// returns the result each call gives the model, and how many calls were
// refused because the turn reached max_tool_calls.
func (t *turn) toolStep(ctx context.Context, step int, calls []model.ToolCall) (results []string, refused int) {
	start := time.Now()
	results = make([]string, len(calls))
	sem := make(chan struct{}, max(1, t.l.ParallelTools.N))
	var wg sync.WaitGroup
	for i, c := range calls {
		callID := fmt.Sprintf("call_%d_%d", step, i+1)
		if int64(t.toolCalls) >= t.l.MaxToolCalls.N {
			refused++
			lim := t.l.MaxToolCalls
			results[i] = t.refuse(step, callID, c, "limit", "", fmt.Sprintf(
				"Not run: this turn reached its limit of %d tool calls (%s).", lim.N, lim.Knob))
			continue
		}
		t.toolCalls++
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			results[i] = t.refuse(step, callID, c, "cancelled", "", "Not run: the turn was stopped before this call could start.")
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			results[i] = t.runTool(ctx, step, callID, c)
		}()
	}
	wg.Wait()
	t.toolTime += time.Since(start)
	return results, refused
}

// arguments returns the model's arguments as JSON for the record: as sent
// when they are JSON, else as a JSON string of the raw text.
func arguments(raw string) json.RawMessage {
	if strings.TrimSpace(raw) == "" {
		return json.RawMessage("{}")
	}
	if json.Valid([]byte(raw)) {
		return json.RawMessage(raw)
	}
	b, _ := json.Marshal(strings.ToValidUTF8(raw, "\uFFFD"))
	return b
}

// refuse records a call that was not run and returns what the model is
// told.
func (t *turn) refuse(step int, callID string, c model.ToolCall, reason, field, msg string) string {
	now := time.Now()
	res := tool.Refusal(c.Name, reason, field, msg)
	rec := event.ToolCall{CallID: callID, TurnID: t.id, Step: step, Tool: c.Name, Arguments: arguments(c.Arguments),
		StartedAt: now, EndedAt: now, Outcome: event.OutcomeError, Refused: reason, Result: res}
	if e, ok := t.a.tools[c.Name]; ok {
		rec.Kind = string(e.Tool.Tool.Kind())
		tb := t.toolBudget(e)
		rec.TimeoutMS, rec.TimeoutSource = tb.Timeout.MS(), tb.Timeout.Source
		rec.Enforcement = tb.Enforcement
	}
	if reason == "cancelled" {
		rec.Outcome, rec.Phase = event.OutcomeCancelled, budget.PhaseCancel
	}
	rec = t.addToolRecord(rec)
	t.em.Emit(&event.ToolFinished{ToolCall: rec})
	return res
}

// runTool runs one tool call under its budget and returns what the model is
// told.
func (t *turn) runTool(ctx context.Context, step int, callID string, c model.ToolCall) string {
	e, ok := t.a.tools[c.Name]
	if !ok {
		return t.refuse(step, callID, c, "unknown_tool", "", fmt.Sprintf("There is no tool named %q. Available tools: %s.",
			c.Name, strings.Join(t.a.order, ", ")))
	}
	args := json.RawMessage(c.Arguments)
	if err := e.schema.Check(args); err != nil {
		var ae *tool.ArgumentError
		errors.As(err, &ae)
		return t.refuse(step, callID, c, ae.Reason, ae.Field, ae.Message+" The tool was not run.")
	}
	if len(strings.TrimSpace(c.Arguments)) == 0 {
		args = json.RawMessage("{}")
	}
	b := t.toolBudget(e)
	start := time.Now()
	var deadline time.Time
	if b.Timeout.D > 0 {
		deadline = start.Add(b.Timeout.D)
	}
	t.em.Emit(&event.ToolStarted{Step: step, CallID: callID, Tool: c.Name, Kind: string(e.Tool.Tool.Kind()),
		Arguments: args, TimeoutMS: b.Timeout.MS(), Deadline: deadline.UTC(), Enforcement: b.Enforcement,
		Source: b.Timeout.Source, IdleTimeoutMS: b.IdleTimeout.MS()})
	act := &activity{step: step, subject: "tool " + c.Name, callID: callID, tool: c.Name, deadline: deadline, limit: b.Timeout.D,
		advisory: b.Enforcement == budget.Advisory}
	t.live.begin(act)

	call := &tool.Call{ID: callID, TurnID: t.id, Tool: c.Name, Input: args, KillGrace: b.KillGrace.D,
		MaxOutput: t.l.MaxToolOutput.N}
	x := tool.Run(ctx, e.Tool.Tool, call, b, tool.Hooks{
		// Every report keeps the turn alive; the coalesced ones become
		// events (tool.Hooks).
		OnAlive: t.live.alive,
		OnProgress: func(r tool.Report) {
			t.em.Emit(&event.ToolProgress{CallID: callID, Tool: c.Name, Progress: r.Progress, Total: r.Total, Message: r.Message})
		},
		OnLate: func(res *tool.Result, err error, ended time.Time) { t.late(callID, res, err, ended) },
	})
	t.live.end(act, true)

	result := tool.ModelResult(c.Name, b, x)
	rec := event.ToolCall{CallID: callID, TurnID: t.id, Step: step, Tool: c.Name, Kind: string(e.Tool.Tool.Kind()),
		Arguments: args, StartedAt: x.Started, EndedAt: x.Ended, DurationMS: x.Elapsed().Milliseconds(),
		TimeoutMS: b.Timeout.MS(), TimeoutSource: b.Timeout.Source, IdleTimeoutMS: b.IdleTimeout.MS(),
		Enforcement: b.Enforcement, Outcome: x.Outcome, Phase: x.Phase, Overran: x.Overran,
		Abandoned: x.Abandoned, ProgressCount: x.Progress, Result: result}
	if x.Result != nil {
		rec.ExitCode, rec.StderrTail, rec.Truncated = x.Result.ExitCode, strings.ToValidUTF8(x.Result.StderrTail, "\uFFFD"), x.Result.Truncated
	}
	var te *tool.Error
	if errors.As(x.Err, &te) {
		if rec.ExitCode == nil {
			rec.ExitCode = te.ExitCode
		}
		if rec.StderrTail == "" {
			rec.StderrTail = te.StderrTail
		}
	}
	rec = t.addToolRecord(rec)
	t.em.Emit(&event.ToolFinished{ToolCall: rec})
	return result
}

type lateResult struct {
	res   *tool.Result
	err   error
	ended time.Time
}

// late records what an abandoned call returned after it was abandoned.
func (t *turn) late(callID string, res *tool.Result, err error, ended time.Time) {
	t.mu.Lock()
	for i := range t.toolRecs {
		if t.toolRecs[i].CallID == callID {
			t.applyLate(&t.toolRecs[i], lateResult{res, err, ended})
			after := t.ended
			cp := t.toolRecs[i]
			t.mu.Unlock()
			if after {
				for _, s := range t.sinks {
					if ls, ok := s.(event.LateSink); ok {
						ls.LateResult(cp)
					}
				}
			}
			return
		}
	}
	defer t.mu.Unlock()
	// The call's record is written just after tool.Run returns; this
	// result beat it there.
	if t.pendingLate == nil {
		t.pendingLate = map[string]lateResult{}
	}
	t.pendingLate[callID] = lateResult{res, err, ended}
}

// addToolRecord stores a tool call record, with any late result that
// arrived before it.
func (t *turn) addToolRecord(rec event.ToolCall) event.ToolCall {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.toolRecs = append(t.toolRecs, rec)
	r := &t.toolRecs[len(t.toolRecs)-1]
	if lr, ok := t.pendingLate[rec.CallID]; ok {
		delete(t.pendingLate, rec.CallID)
		out := *r
		t.applyLate(r, lr)
		return out // tool_finished carries the record as it was at the end
	}
	return *r
}

// applyLate updates rec with a late result and, while the turn runs,
// reports it as a late_result event. After the turn ended the caller passes
// the record to the run's event.LateSinks. t.mu is held.
func (t *turn) applyLate(rec *event.ToolCall, lr lateResult) {
	var out string
	if lr.res != nil {
		out = strings.ToValidUTF8(string(lr.res.Output), "\uFFFD")
	}
	rec.LateResult, rec.LateOutput = true, out
	if t.ended {
		return
	}
	ev := &event.LateResult{CallID: rec.CallID, Tool: rec.Tool, DurationMS: lr.ended.Sub(rec.StartedAt).Milliseconds(), Output: out}
	if lr.err != nil {
		ev.Error = lr.err.Error()
	}
	t.em.Emit(ev)
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

// CallTool runs one call of the named tool under its budget, outside any
// turn, and returns its record: the `timebox tool call` command. Events
// (tool_started, tool_progress, tool_finished) go to sinks. Cancelling ctx
// stops the call as a cancelled turn would.
func (a *Agent) CallTool(ctx context.Context, name string, input json.RawMessage, sinks ...event.Sink) event.ToolCall {
	t := &turn{a: a, id: "tool-call", start: time.Now(), b: a.budgets, l: a.limits}
	t.em, t.sinks = event.NewEmitter(t.id, sinks...), sinks
	t.live = newLiveness(budget.Duration{}, t.b.ProgressNotice.D, func(v event.Payload) { t.em.Emit(v) }, func(*budget.TimeoutError) {})
	defer t.live.close()
	t.runTool(ctx, 1, "call_1_1", model.ToolCall{ID: "call_1_1", Name: name, Arguments: string(input)})
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ended = true
	t.em.Close()
	return t.toolRecs[0]
}
