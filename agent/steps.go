package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/tool"
)

// State is a turn between two of its units of work — a model step, one
// tool call, the end — in a form that can be stored and sent as JSON. An
// engine that runs each unit in a different place (package temporal runs
// each as a Temporal activity, perhaps on another machine) carries it from
// one unit to the next: Begin, then Think and Call (or Refuse) in turn,
// then End when Think has not ended the turn itself. Run does the same
// work in one process, keeping the state in memory.
//
// Each unit runs under the turn's watchdogs as Run's loop does: the turn's
// ceiling counted from Start, the step watchdog and still_working notices
// for what the unit runs, and its context's cancellation.
type State struct {
	TurnID string `json:"turn_id"`
	// Input is the turn's input, its history repaired (RepairHistory).
	Input Input     `json:"input"`
	Start time.Time `json:"start"`
	// Budgets and Limits are the turn's budgets (the agent's with the
	// request's); in JSON, "budgets" lists each knob's value, source and
	// knob by key.
	Budgets  budget.Budgets `json:"-"`
	Limits   budget.Limits  `json:"-"`
	Repaired int            `json:"repaired,omitempty"`

	// Messages are what the turn added to the conversation so far.
	Messages   []model.Message `json:"messages"`
	Steps      int             `json:"steps"`
	ToolCalls  int             `json:"tool_calls"`
	LLMUsed    time.Duration   `json:"llm_used"`
	ToolTime   time.Duration   `json:"tool_time"`
	IdleStreak int             `json:"idle_streak,omitempty"`
	Failovers  int             `json:"failovers,omitempty"`
	Partial    string          `json:"partial,omitempty"`
	LastStep   string          `json:"last_step,omitempty"`
	LastModel  string          `json:"last_model,omitempty"`

	Summary           string `json:"summary,omitempty"`
	CompactedUpTo     int    `json:"compacted_up_to,omitempty"`
	CompactionFailed  *Cause `json:"compaction_failed,omitempty"`
	CompactionTimeout bool   `json:"compaction_timeout,omitempty"`
	Insufficient      bool   `json:"insufficient,omitempty"`
	RetryAt           int    `json:"retry_at,omitempty"`

	ToolRecords  []event.ToolCall  `json:"tool_records,omitempty"`
	ModelRecords []event.ModelCall `json:"model_records,omitempty"`

	// Stopped is what the turn was doing when a turn-level budget or a
	// cancellation stopped it.
	Stopped *StopNote `json:"stopped,omitempty"`
	// Providers holds the per-conversation state of the chain's providers
	// that keep one (model.Resumable), by the index of the provider's first
	// endpoint in the chain.
	Providers map[int]json.RawMessage `json:"providers,omitempty"`
}

// knobValue is one budget of State in JSON: budget.Duration leaves its
// value out of JSON.
type knobValue struct {
	N      int64         `json:"n"`
	Source budget.Source `json:"source,omitempty"`
	Knob   string        `json:"knob,omitempty"`
}

// stateJSON is State without its JSON methods.
type stateJSON State

// MarshalJSON writes s with its budgets under "budgets".
func (s State) MarshalJSON() ([]byte, error) {
	b := map[string]knobValue{}
	for _, k := range budget.Knobs {
		n, src, knob := k.Get(&s.Budgets, &s.Limits)
		b[k.Key] = knobValue{N: n, Source: src, Knob: knob}
	}
	return json.Marshal(struct {
		stateJSON
		Budgets map[string]knobValue `json:"budgets"`
	}{stateJSON(s), b})
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (s *State) UnmarshalJSON(data []byte) error {
	var v struct {
		stateJSON
		Budgets map[string]knobValue `json:"budgets"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	*s = State(v.stateJSON)
	for key, kv := range v.Budgets {
		if k, ok := budget.KnobByKey(key); ok {
			k.Set(&s.Budgets, &s.Limits, kv.N, kv.Source, kv.Knob)
		}
	}
	return nil
}

// StopNote is what a turn was doing when a turn-level budget or a
// cancellation stopped it, for its closing message and flags.
type StopNote struct {
	// Desc says what ran: "tool crawl, running for 41s".
	Desc string `json:"desc"`
	// Tools are the tools that were running.
	Tools []string `json:"tools,omitempty"`
	// DuringRun: a tool was running; DuringCompact: a history compaction.
	DuringRun     bool `json:"during_run,omitempty"`
	DuringCompact bool `json:"during_compact,omitempty"`
}

// Merge adds what o says ran to n: the notes of tool calls stopped at the
// same time in different places.
func (n *StopNote) Merge(o *StopNote) *StopNote {
	switch {
	case o == nil:
		return n
	case n == nil:
		c := *o
		return &c
	}
	c := *n
	c.Tools = append(append([]string(nil), n.Tools...), o.Tools...)
	c.DuringRun = n.DuringRun || o.DuringRun
	c.DuringCompact = n.DuringCompact || o.DuringCompact
	switch {
	case len(c.Tools) > 1:
		c.Desc = "tools " + strings.Join(c.Tools, ", ") + " running"
	case o.DuringRun && !n.DuringRun:
		c.Desc = o.Desc
	}
	return &c
}

// Cause is why a turn stopped, or why its compaction failed, in a form
// that can be sent: the budget that ran out, the cancellation, the
// provider's error, or else its text.
type Cause struct {
	Timeout      *budget.TimeoutError      `json:"timeout,omitempty"`
	Cancel       *budget.CancelError       `json:"cancel,omitempty"`
	ReplyTooLong *budget.ReplyTooLongError `json:"reply_too_long,omitempty"`
	Model        *ModelError               `json:"model,omitempty"`
	Text         string                    `json:"text,omitempty"`
}

// ModelError is a model.Error without its wrapped error.
type ModelError struct {
	Provider   string        `json:"provider"`
	Status     int           `json:"status,omitempty"`
	Message    string        `json:"message,omitempty"`
	RetryAfter time.Duration `json:"retry_after,omitempty"`
	Malformed  bool          `json:"malformed,omitempty"`
	TooLong    bool          `json:"too_long,omitempty"`
}

// CauseOf returns err as a Cause; nil for nil.
func CauseOf(err error) *Cause {
	if err == nil {
		return nil
	}
	c := &Cause{Text: err.Error()}
	var me *model.Error
	switch te, ok := budget.AsTimeout(err); {
	case ok:
		c.Timeout = te
	case errors.As(err, &c.Cancel):
	case errors.As(err, &c.ReplyTooLong):
	case errors.As(err, &me):
		c.Model = &ModelError{Provider: me.Provider, Status: me.Status, Message: me.Message, RetryAfter: me.RetryAfter,
			Malformed: me.Malformed, TooLong: me.TooLong}
	}
	return c
}

// Err returns the error c describes; nil for a nil c.
func (c *Cause) Err() error {
	switch {
	case c == nil:
		return nil
	case c.Timeout != nil:
		return c.Timeout
	case c.Cancel != nil:
		return c.Cancel
	case c.ReplyTooLong != nil:
		return c.ReplyTooLong
	case c.Model != nil:
		m := c.Model
		return &model.Error{Provider: m.Provider, Status: m.Status, Message: m.Message, RetryAfter: m.RetryAfter,
			Malformed: m.Malformed, TooLong: m.TooLong}
	}
	return errors.New(c.Text)
}

// Begin begins a turn as Run does — its id, its budgets (the agent's with
// the request's), its repaired history — emits turn_started to sinks, and
// returns its state.
func (a *Agent) Begin(in Input, sinks ...event.Sink) *State {
	t := a.newTurn(in, sinks)
	t.em.Emit(t.started())
	return t.save()
}

// Think makes the turn's next model step as Run does: the step checks
// (max_steps, llm_budget), history compaction, the model call with its
// failover. It returns the tool calls the model asked for, for Call or
// Refuse; or, when the turn ends here — an answer, a budget, a failure, a
// cancellation of ctx — it ends the turn (turn_finished) and returns its
// Result. s is updated.
func (a *Agent) Think(ctx context.Context, s *State, sinks ...event.Sink) ([]model.ToolCall, *Result) {
	t := a.restore(s, sinks)
	var (
		calls []model.ToolCall
		st    *stop
	)
	t.under(ctx, func(ctx context.Context) { calls, st = t.think(ctx) })
	if st != nil {
		res := t.finish(*st)
		*s = *t.save()
		return nil, res
	}
	*s = *t.save()
	return calls, nil
}

// Called is how one tool call run by Call went.
type Called struct {
	// Result is what the model is told.
	Result string `json:"result"`
	// Record is the call's record, as tool_finished carried it.
	Record event.ToolCall `json:"record"`
	// Stopped, when a turn-level budget or ctx stopped the turn during
	// the call, is what was running (StopNote.Merge the notes of calls of
	// one batch); Cause is what stopped it.
	Stopped *StopNote `json:"stopped,omitempty"`
	Cause   *Cause    `json:"cause,omitempty"`
}

// Call runs tool call c of step's batch, named callID ("call_<step>_<n>",
// n from 1), under its budget as Run does, with the turn's ceiling and
// step watchdog, and emits its events to sinks. It does not change s: the
// engine adds the record (s.ToolRecords) and, once the batch is over, the
// results (Heard). The caller counts the call in s.ToolCalls, or refuses it
// (Refuse) past max_tool_calls.
func (a *Agent) Call(ctx context.Context, s *State, step int, callID string, c model.ToolCall, sinks ...event.Sink) Called {
	t := a.restore(s, sinks)
	t.toolRecs = nil
	var out Called
	t.under(ctx, func(ctx context.Context) {
		out.Result = t.runTool(ctx, step, callID, c)
		out.Cause = CauseOf(budget.Cause(ctx))
	})
	out.Record = t.toolRecs[0]
	out.Stopped = t.note()
	return out
}

// Refusal reasons for Refuse: the turn reached max_tool_calls, or was
// stopped before the call could start.
const (
	RefusedLimit     = "limit"
	RefusedCancelled = "cancelled"
)

// Refuse records a call of step's batch that is not run — reason is
// RefusedLimit or RefusedCancelled — emits its tool_finished, and returns
// what the model is told with the record. s is not changed.
func (a *Agent) Refuse(s *State, step int, callID string, c model.ToolCall, reason string, sinks ...event.Sink) Called {
	t := a.restore(s, sinks)
	t.toolRecs = nil
	var msg string
	switch reason {
	case RefusedLimit:
		lim := t.l.MaxToolCalls
		msg = fmt.Sprintf("Not run: this turn reached its limit of %d tool calls (%s).", lim.N, lim.Knob)
	default:
		reason, msg = RefusedCancelled, "Not run: the turn was stopped before this call could start."
	}
	res := t.refuse(step, callID, c, reason, "", msg)
	return Called{Result: res, Record: t.toolRecs[0]}
}

// Lost records a call that was running in a process that was lost — a
// worker that died, or stopped answering — and emits its tool_finished:
// outcome interrupted, and a tool_error for the model saying that the call
// was not run again, so it may or may not have done its work. why names
// what was lost ("worker w1 stopped sending heartbeats"); started is when
// the call was started, zero if unknown. s is not changed.
func (a *Agent) Lost(s *State, step int, callID string, c model.ToolCall, started time.Time, why string, sinks ...event.Sink) Called {
	t := a.restore(s, sinks)
	now := time.Now()
	if started.IsZero() {
		started = now
	}
	msg := fmt.Sprintf("The call was lost: %s. It was not run again, so it may or may not have done its work; check before asking for it again.", why)
	res := tool.Refusal(c.Name, "worker_lost", "", msg)
	rec := event.ToolCall{CallID: callID, TurnID: t.id, Step: step, Tool: c.Name, Arguments: arguments(c.Arguments),
		StartedAt: started, EndedAt: now, DurationMS: now.Sub(started).Milliseconds(), Outcome: event.OutcomeInterrupted, Result: res}
	if e, ok := a.tools[c.Name]; ok {
		rec.Kind = string(e.Tool.Tool.Kind())
		tb := t.toolBudget(e)
		rec.TimeoutMS, rec.TimeoutSource = tb.Timeout.MS(), tb.Timeout.Source
		rec.IdleTimeoutMS, rec.Enforcement = tb.IdleTimeout.MS(), tb.Enforcement
	}
	t.em.Emit(&event.ToolFinished{ToolCall: rec})
	return Called{Result: res, Record: rec}
}

// ToolBudget returns the budget of the named tool's calls in the turn of
// s, its retries (Tool.Retries), and whether the agent has the tool.
func (a *Agent) ToolBudget(s *State, name string) (b budget.ToolBudget, retries int, ok bool) {
	e, ok := a.tools[name]
	if !ok {
		return budget.ToolBudget{}, 0, false
	}
	return (&turn{b: s.Budgets}).toolBudget(e), e.Retries, true
}

// Heard adds the results of a batch of tool calls to the conversation, as
// Run does once the batch is over.
func (s *State) Heard(calls []model.ToolCall, results []string) {
	s.Messages = append(s.Messages, toolMessages(calls, results)...)
}

// End ends the turn for cause, as Run does when a budget, a cancellation or
// max_tool_calls stops it between units of work: the closing message,
// turn_finished, the record. reason is the stop reason; refused, for
// max_tool_calls, counts the calls that were not run.
func (a *Agent) End(s *State, reason budget.StopReason, cause *Cause, refused int, sinks ...event.Sink) *Result {
	t := a.restore(s, sinks)
	st := stop{reason: reason, cause: cause.Err()}
	if reason == budget.MaxToolCalls {
		st.message = refusedText(refused)
	}
	return t.finish(st)
}

// StopReasonOf returns the stop reason of a turn stopped by cause, as Run
// gives it.
func StopReasonOf(cause error) budget.StopReason {
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(cause)
	return (&turn{}).stopFromContext(ctx).reason
}

// restore makes the in-memory turn of s.
func (a *Agent) restore(s *State, sinks []event.Sink) *turn {
	t := &turn{a: a, in: s.Input, id: s.TurnID, start: s.Start, b: s.Budgets, l: s.Limits, repaired: s.Repaired}
	t.em, t.sinks = event.NewEmitter(t.id, sinks...), sinks
	t.msgs = append([]model.Message(nil), s.Messages...)
	t.steps, t.toolCalls, t.llmUsed, t.toolTime = s.Steps, s.ToolCalls, s.LLMUsed, s.ToolTime
	t.idleStreak, t.failovers = s.IdleStreak, s.Failovers
	t.partial, t.lastStep, t.lastModel = s.Partial, s.LastStep, s.LastModel
	t.summary, t.compactedUpTo, t.compactionFailed = s.Summary, s.CompactedUpTo, s.CompactionFailed.Err()
	t.compactionTimeout, t.insufficient, t.retryAt = s.CompactionTimeout, s.Insufficient, s.RetryAt
	t.toolRecs = append([]event.ToolCall(nil), s.ToolRecords...)
	t.modelRecs = append([]event.ModelCall(nil), s.ModelRecords...)
	if n := s.Stopped; n != nil {
		t.stopOnce.Do(func() {
			t.stopDesc, t.stopTools = n.Desc, n.Tools
			t.stopDuringRun, t.stopDuringCompact = n.DuringRun, n.DuringCompact
		})
	}
	a.resume(t.conversationID(), s.Providers)
	return t
}

// save returns t's state.
func (t *turn) save() *State {
	s := &State{
		TurnID: t.id, Input: t.in, Start: t.start, Budgets: t.b, Limits: t.l, Repaired: t.repaired,
		Messages: t.msgs, Steps: t.steps, ToolCalls: t.toolCalls, LLMUsed: t.llmUsed, ToolTime: t.toolTime,
		IdleStreak: t.idleStreak, Failovers: t.failovers, Partial: t.partial, LastStep: t.lastStep, LastModel: t.lastModel,
		Summary: t.summary, CompactedUpTo: t.compactedUpTo, CompactionFailed: CauseOf(t.compactionFailed),
		CompactionTimeout: t.compactionTimeout, Insufficient: t.insufficient, RetryAt: t.retryAt,
		Stopped: t.note(), Providers: t.a.suspend(t.conversationID()),
	}
	t.mu.Lock()
	s.ToolRecords = append([]event.ToolCall(nil), t.toolRecs...)
	s.ModelRecords = append([]event.ModelCall(nil), t.modelRecs...)
	t.mu.Unlock()
	return s
}

// note returns what the turn was doing when it was stopped, nil if it was
// not.
func (t *turn) note() *StopNote {
	t.stopOnce.Do(func() {}) // a capture under way has finished
	if t.stopDesc == "" && len(t.stopTools) == 0 {
		return nil
	}
	return &StopNote{Desc: t.stopDesc, Tools: t.stopTools, DuringRun: t.stopDuringRun, DuringCompact: t.stopDuringCompact}
}

// conversationID is the conversation the turn's model requests name.
func (t *turn) conversationID() string {
	if t.in.SessionID != "" {
		return t.in.SessionID
	}
	return t.id
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

// resume gives the chain's resumable providers their per-conversation
// state.
func (a *Agent) resume(conv string, states map[int]json.RawMessage) {
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
