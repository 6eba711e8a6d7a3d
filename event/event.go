// Package event defines what a turn tells the world while it runs — the
// events of spec §7 — and the durable records it leaves (spec §8): one per
// tool call, one per model call attempt, one per turn.
//
// Events reach sinks in seq order through an Emitter. The package does no
// I/O; sinks that write to a terminal, a socket or a database live with
// those.
package event

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/longjson"
)

// Type is the type of an event.
type Type string

// The event types of spec §7, plus LateResult.
const (
	TypeTurnStarted        Type = "turn_started"
	TypeLLMStarted         Type = "llm_started"
	TypeLLMDelta           Type = "llm_delta"
	TypeLLMFinished        Type = "llm_finished"
	TypeFailover           Type = "failover"
	TypeToolStarted        Type = "tool_started"
	TypeToolProgress       Type = "tool_progress"
	TypeStillWorking       Type = "still_working"
	TypeToolFinished       Type = "tool_finished"
	TypeCompactionStarted  Type = "compaction_started"
	TypeCompactionFinished Type = "compaction_finished"
	TypeTurnFinished       Type = "turn_finished"
	TypeApprovalRequested  Type = "approval_requested"
	TypeApprovalDecided    Type = "approval_decided"
	// TypeLateResult reports that an abandoned call returned while its turn
	// was still running. The result was not given to the model.
	TypeLateResult Type = "late_result"
)

// Event is one thing that happened in a turn. Its JSON form is one flat
// object: the header fields below and the fields of Data side by side,
// `{"seq": 3, "turn_id": "...", "type": "tool_started", "at": "...",
// "call_id": "...", ...}`.
type Event struct {
	// Seq is the event's number in its turn, from 1, each greater than the
	// last (with a gap only past store.PublishedAhead); it is the SSE id.
	Seq int64 `json:"seq"`
	// TurnID (turn_id) names the turn.
	TurnID string `json:"turn_id"`
	// Type is the event's type; it says which payload Data holds.
	Type Type `json:"type"`
	// At is when it happened (RFC 3339 with nanoseconds, UTC, on the wire).
	At time.Time `json:"at"`
	// Data is a Payload matching Type; an event of a type this version
	// does not know, read back, keeps its JSON as a json.RawMessage.
	Data any `json:"-"`
}

// TurnStarted opens a turn; it carries the resolved budgets.
type TurnStarted struct {
	// SessionID (session_id) is the conversation the turn belongs to;
	// empty (omitted) for a turn outside one.
	SessionID string `json:"session_id,omitempty"`
	// Agent is the agent's name; empty (omitted) when it has none.
	Agent string `json:"agent,omitempty"`
	// Input is the user's message.
	Input string `json:"input"`
	// Model is the primary model, provider:model.
	Model string `json:"model"`
	// Budgets holds every process-wide budget and limit the turn runs
	// under, by its key (timeouts.tool, limits.max_steps, …).
	Budgets map[string]BudgetValue `json:"budgets"`
	// Tools holds each tool's budget by tool name; empty (omitted) when
	// the agent has no tools.
	Tools map[string]ToolBudgetSummary `json:"tools,omitempty"`
	// HistoryRepaired counts the messages of the session's history that
	// were added or dropped so that every tool call has one result (a
	// turn cut by a crash; see agent.RepairHistory).
	HistoryRepaired int `json:"history_repaired,omitempty"`
	// Traceparent is the W3C traceparent of the turn's invoke_agent span,
	// when the turn is traced: the trace to look for, and the span the
	// process that ends the turn makes again when the one that began it
	// died before it could end it. CallerTraceparent is the span that one
	// is a child of (the traceparent the turn was started under), if any.
	Traceparent       string `json:"traceparent,omitempty"`
	CallerTraceparent string `json:"caller_traceparent,omitempty"`
}

// BudgetValue is one resolved budget as turn_started, turn_finished and
// `timebox validate` show it; see budget.BudgetValue.
type BudgetValue = budget.BudgetValue

// ToolBudgetSummary is one tool's resolved budget in turn_started.
type ToolBudgetSummary struct {
	// TimeoutMS (timeout_ms) is the tool's timeout in milliseconds, and
	// Source where it came from.
	TimeoutMS int64         `json:"timeout_ms"`
	Source    budget.Source `json:"source"`
	// IdleTimeoutMS (idle_timeout_ms) is the tool's idle timeout in
	// milliseconds; 0 is off.
	IdleTimeoutMS int64 `json:"idle_timeout_ms"`
	// Enforcement is how the timeout is enforced: hard, cooperative or
	// advisory.
	Enforcement budget.Enforcement `json:"enforcement"`
}

// LLMStarted is sent when a model call attempt starts.
type LLMStarted struct {
	// Step is the step, from 1: each model call of the turn is one step.
	Step int `json:"step"`
	// Model is the model's name, as after provider: in the agent file.
	Model string `json:"model"`
	// Provider is openai, anthropic or script.
	Provider string `json:"provider"`
	// Profile names the credential: the variable the key came from, never
	// the key; empty for the script model.
	Profile string `json:"profile"`
	// Attempt is the attempt within the step, from 1; each failover adds
	// one.
	Attempt int `json:"attempt"`
	// Traceparent is the W3C traceparent of the attempt's chat span, when
	// the turn is traced and the span sampled: the one its model request
	// carries. A Temporal worker that records the attempt lost with the
	// worker that made it makes that span again, with these ids.
	Traceparent string `json:"traceparent,omitempty"`
}

// LLMDelta is a piece of the model's reply text.
type LLMDelta struct {
	// Step is the step the reply belongs to.
	Step int `json:"step"`
	// Text is the piece of text; the reply is the concatenation of a
	// step's deltas.
	Text string `json:"text"`
}

// LLMFinished closes a model call attempt; it carries the attempt's record.
type LLMFinished struct {
	ModelCall
	// ToolCalls (tool_calls) counts the tool calls the reply asked for.
	ToolCalls int `json:"tool_calls"`
}

// Failover is sent when a model call attempt failed in an LLM phase and the
// next credential or model is tried.
type Failover struct {
	// Step is the step of the attempts.
	Step int `json:"step"`
	// From is the attempt that failed and To the one that comes next, each
	// provider:model with its credential in parentheses when it has one.
	From string `json:"from"`
	To   string `json:"to"`
	// Phase says why: llm_first_chunk, llm_idle, llm_http or llm_empty.
	Phase budget.Phase `json:"phase"`
	// Reason is the failure, as the provider or the watchdog said it.
	Reason string `json:"reason"`
	// Attempt is the number of the attempt that comes next.
	Attempt int `json:"attempt"`
}

// ToolStarted is sent when a tool call starts running under its budget.
type ToolStarted struct {
	// Step is the step whose reply asked for the call.
	Step int `json:"step"`
	// CallID (call_id) names the call, unique in the turn; every later
	// event of the call names it.
	CallID string `json:"call_id"`
	// Tool is the tool's name.
	Tool string `json:"tool"`
	// Kind is exec, go or mcp.
	Kind string `json:"kind"`
	// Arguments are the arguments the model sent (JSON); omitted when
	// empty.
	Arguments json.RawMessage `json:"arguments,omitempty"`
	// TimeoutMS (timeout_ms) is the call's timeout in milliseconds, and
	// Deadline when it ends; progress never moves it.
	TimeoutMS int64     `json:"timeout_ms"`
	Deadline  time.Time `json:"deadline"`
	// Enforcement is how the timeout is enforced: hard, cooperative or
	// advisory.
	Enforcement budget.Enforcement `json:"enforcement"`
	// Source is where the timeout came from; the call's record holds the
	// same value as timeout_source.
	Source budget.Source `json:"source"`
	// IdleTimeoutMS (idle_timeout_ms) is the longest silence allowed
	// between two progress reports, in milliseconds; 0 is off.
	IdleTimeoutMS int64 `json:"idle_timeout_ms"`
	// Knob is the setting the timeout came from (tools[crawl].timeout
	// in agent.yaml, timeouts.tool), as the call's span names it.
	Knob string `json:"knob,omitempty"`
	// Traceparent is the W3C traceparent of the call's execute_tool
	// span, when the turn is traced: the process that ends the turn
	// makes that span again, with these ids, when the one that ran the
	// call died before it could end it.
	Traceparent string `json:"traceparent,omitempty"`
}

// ToolProgress is a progress report from a running tool call. Progress and
// Total are absent when the tool did not send them.
type ToolProgress struct {
	// CallID (call_id) names the call, and Tool is the tool's name.
	CallID string `json:"call_id"`
	Tool   string `json:"tool"`
	// Progress is how far the call is, of Total; nil (omitted) when the
	// tool did not say.
	Progress *float64 `json:"progress,omitempty"`
	Total    *float64 `json:"total,omitempty"`
	// Message is what the call is doing; empty (omitted) when the tool did
	// not say.
	Message string `json:"message,omitempty"`
}

// StillWorking says a step has been running for a while. A turn sends at
// most one per timeouts.progress_notice, on the turn's own beat (the first
// an interval after something started running when nothing was), and it
// names in Calls every running call that has been silent: no progress
// report (a tool's report, a model's stream chunk) within the interval.
// A call that reported progress within it is left out, and when every
// running call did, no notice is sent (docs/decisions/quieter-notices.md).
//
// The top-level fields describe the calls together, as they described the
// one call of a notice before Calls: for one call its subject, call id,
// elapsed time and limit; for several, a subject naming them all ("tools
// legacy_sync, report"), the longest elapsed time, and no call id or limit.
type StillWorking struct {
	// Step is the step that is running.
	Step int `json:"step"`
	// Subject is what is running: "tool crawl", "model gpt-4o", or "tools
	// legacy_sync, report" for several tool calls.
	Subject string `json:"subject"`
	// CallID is the tool call's, when the notice names one tool call.
	CallID string `json:"call_id,omitempty"`
	// ElapsedMS is how long the call has been running; for several, the
	// longest.
	ElapsedMS int64 `json:"elapsed_ms"`
	// LimitMS is the budget the call runs under, when the notice names one
	// call and it has one.
	LimitMS int64 `json:"limit_ms,omitempty"`
	// Calls are the silent calls the notice names, in the order the model
	// asked for them. It is empty in notices stored before it existed.
	Calls []SilentCall `json:"calls,omitempty"`
	// Waiting is set on a notice that nothing of the turn runs: what its
	// work waits for and what to do, for a person. The Temporal engine
	// sends one when no worker has taken the turn's work for a while
	// (every worker died, or none runs); Calls is then empty.
	Waiting string `json:"waiting,omitempty"`
}

// SilentCall is one call a still_working notice names: running, and silent
// for at least the notice interval.
type SilentCall struct {
	// Subject is what is running: "tool crawl" or "model gpt-4o".
	Subject string `json:"subject"`
	// CallID and Tool are the tool call's; empty for a model call.
	CallID string `json:"call_id,omitempty"`
	Tool   string `json:"tool,omitempty"`
	// ElapsedMS is how long it has been running.
	ElapsedMS int64 `json:"elapsed_ms"`
	// LimitMS is the budget it runs under, when it has one.
	LimitMS int64 `json:"limit_ms,omitempty"`
	// SilentMS is how long since its last progress report; since it
	// started when it has sent none.
	SilentMS int64 `json:"silent_ms"`
}

// ToolFinished closes a tool call with its record; Outcome says how it
// ended (ok, error, timed_out, cancelled, abandoned, interrupted when
// the next start writes it for a call its dead process left running, or,
// for a call that waited for a person, denied or approval_expired).
type ToolFinished struct {
	ToolCall
	// TurnID shadows the record's own turn_id so the flat JSON form has the
	// header's only; it is always empty.
	TurnID string `json:"turn_id,omitempty"`
}

// ApprovalRequested is sent when a tool call needs a person's decision
// before it runs: the call waits, without a slot of parallel_tools, until
// ExpiresAt (timeouts.approval or the tool's approval_timeout). Round
// counts the requests for the call: a decision that could not be used at
// once (its turn was not running) is asked for again.
type ApprovalRequested struct {
	// Step is the step whose reply asked for the call.
	Step int `json:"step"`
	// CallID (call_id) names the call, and Tool is the tool's name.
	CallID string `json:"call_id"`
	Tool   string `json:"tool"`
	// Arguments are the arguments the model sent (JSON).
	Arguments json.RawMessage `json:"arguments,omitempty"`
	// ExpiresAt (expires_at) is when the call stops waiting: past it
	// without a decision it is not run (approval_expired).
	ExpiresAt time.Time `json:"expires_at"`
	// TimeoutMS (timeout_ms) is how long the call may wait, in
	// milliseconds: timeouts.approval or the tool's approval_timeout.
	// Source is where that came from, and Knob what changes it.
	TimeoutMS int64         `json:"timeout_ms"`
	Source    budget.Source `json:"source"`
	Knob      string        `json:"knob,omitempty"`
	// Round counts the requests for the call; 0 (omitted) for the first.
	Round int `json:"round,omitempty"`
}

// ApprovalDecided closes the wait of ApprovalRequested: Decision is
// approve, deny or expired (no decision before expires_at); By says who
// decided, WaitedMS how long the call waited.
type ApprovalDecided struct {
	// CallID (call_id) names the call, and Tool is the tool's name.
	CallID string `json:"call_id"`
	Tool   string `json:"tool"`
	// Decision is approve, deny or expired.
	Decision Decision `json:"decision"`
	// By is who decided, as they said; empty (omitted) for an expiry.
	By string `json:"by,omitempty"`
	// Reason is why, in their words; empty (omitted) when none was given.
	Reason string `json:"reason,omitempty"`
	// WaitedMS (waited_ms) is how long the call waited, in milliseconds.
	WaitedMS int64 `json:"waited_ms"`
	// Round is the request's round (ApprovalRequested.Round); 0 (omitted)
	// for the first.
	Round int `json:"round,omitempty"`
	// Stale marks an approval made too long before its call could start
	// (agent.ApprovalFresh): it is not acted on, and the call is asked
	// for again (approval_requested with the next round).
	Stale bool `json:"stale,omitempty"`
}

// Decision is a person's decision on a call that waits for one.
type Decision string

// The decisions on a call (approval_decided).
const (
	// Approve lets the call run.
	Approve Decision = "approve"
	// Deny refuses the call: it is not run, and the model gets a
	// tool_denied result with the reason.
	Deny Decision = "deny"
	// Expired: no decision came before the call's approval timeout.
	Expired Decision = "expired"
)

// LateResult reports what an abandoned tool call returned after it was
// abandoned. It was recorded, never given to the model.
type LateResult struct {
	// CallID (call_id) names the call, and Tool is the tool's name.
	CallID string `json:"call_id"`
	Tool   string `json:"tool"`
	// DurationMS (duration_ms) is how long the call ran in all, in
	// milliseconds.
	DurationMS int64 `json:"duration_ms"`
	// Output is what the call returned.
	Output string `json:"output"`
	// Error is the error it returned; empty (omitted) when none.
	Error string `json:"error,omitempty"`
}

// CompactionStarted is sent when older history is being summarised.
type CompactionStarted struct {
	// Step is the step about to be made.
	Step int `json:"step"`
	// Attempt numbers the compactions begun for the step, from 1: one
	// asked again after its worker was lost numbers on (omitted by
	// versions before it; read as 1).
	Attempt int `json:"attempt,omitempty"`
	// EstimatedTokens (estimated_tokens) is the prompt's estimated size in
	// tokens, and CompactAt (compact_at) the threshold it passed.
	EstimatedTokens int `json:"estimated_tokens"`
	CompactAt       int `json:"compact_at"`
	// LimitMS (limit_ms) is the compaction's budget (timeouts.compaction),
	// in milliseconds.
	LimitMS int64 `json:"limit_ms"`
	// Model and Provider are those of the compaction's model call: the
	// primary model (omitted by versions before them).
	Model    string `json:"model,omitempty"`
	Provider string `json:"provider,omitempty"`
	// Traceparent is the W3C traceparent of the compaction's chat span,
	// when the turn is traced and the span sampled: the one its model
	// request carries. Whoever records the compaction lost, or ends the
	// turn while it runs, makes that span with these ids.
	Traceparent string `json:"traceparent,omitempty"`
}

// CompactionFinished closes a compaction.
type CompactionFinished struct {
	// Step is the step the compaction ran before.
	Step int `json:"step"`
	// Outcome is how it ended: ok, insufficient (it worked but the
	// conversation is still over the threshold), timed_out, error, …
	Outcome Outcome `json:"outcome"`
	// Phase is the phase of the budget or cancellation that ended it;
	// empty (omitted) otherwise.
	Phase budget.Phase `json:"phase,omitempty"`
	// DurationMS (duration_ms) is how long it took, in milliseconds.
	DurationMS int64 `json:"duration_ms"`
	// TokensBefore and TokensAfter (tokens_before, tokens_after) are the
	// prompt's estimated size in tokens before and after.
	TokensBefore int `json:"tokens_before"`
	TokensAfter  int `json:"tokens_after"`
	// Message says what went wrong and what to change; empty (omitted)
	// when it went well.
	Message string `json:"message,omitempty"`
	// Record is the compaction's model call record, as the turn's record
	// lists it among its model calls.
	Record *ModelCall `json:"record,omitempty"`
}

// TurnFinished closes a turn.
type TurnFinished struct {
	// Status is completed, stopped, failed, cancelled or interrupted, and
	// StopReason (stop_reason) says why the turn ended.
	Status     budget.Status     `json:"status"`
	StopReason budget.StopReason `json:"stop_reason"`
	// Message is for the person waiting: the answer when the turn
	// completed; otherwise what happened, how long it ran, the last step
	// and what to change.
	Message string `json:"message"`
	// Answer is the model's answer; when the turn did not complete, the
	// text it had written so far.
	Answer string `json:"answer"`
	// Flags are the turn's timeout flags, and Totals its counters.
	Flags  Flags  `json:"flags"`
	Totals Totals `json:"totals"`
	// Limit is the budget that stopped the turn — its key, value, source
	// and the knob that changes it — for a stop by a budget or limit
	// (turn_timeout, no_progress, llm_budget_exhausted, max_steps,
	// max_tool_calls, model_unresponsive, reply_too_long,
	// compaction_failed); absent otherwise.
	Limit *BudgetValue `json:"limit,omitempty"`
}

// Payload is the data of one event: one of this package's payload types
// (*TurnStarted, *ToolStarted, ...). The set is closed: the unexported
// method keeps other packages from adding to it, so Emit takes only what
// a reader knows how to read, and a payload's Type is written next to its
// type, not in a switch kept in step by hand.
type Payload interface {
	// Type is the event type the payload is sent as.
	Type() Type
	payload()
}

// Type returns TypeTurnStarted.
func (*TurnStarted) Type() Type { return TypeTurnStarted }

// Type returns TypeLLMStarted.
func (*LLMStarted) Type() Type { return TypeLLMStarted }

// Type returns TypeLLMDelta.
func (*LLMDelta) Type() Type { return TypeLLMDelta }

// Type returns TypeLLMFinished.
func (*LLMFinished) Type() Type { return TypeLLMFinished }

// Type returns TypeFailover.
func (*Failover) Type() Type { return TypeFailover }

// Type returns TypeToolStarted.
func (*ToolStarted) Type() Type { return TypeToolStarted }

// Type returns TypeToolProgress.
func (*ToolProgress) Type() Type { return TypeToolProgress }

// Type returns TypeStillWorking.
func (*StillWorking) Type() Type { return TypeStillWorking }

// Type returns TypeToolFinished.
func (*ToolFinished) Type() Type { return TypeToolFinished }

// Type returns TypeLateResult.
func (*LateResult) Type() Type { return TypeLateResult }

// Type returns TypeCompactionStarted.
func (*CompactionStarted) Type() Type { return TypeCompactionStarted }

// Type returns TypeCompactionFinished.
func (*CompactionFinished) Type() Type { return TypeCompactionFinished }

// Type returns TypeTurnFinished.
func (*TurnFinished) Type() Type { return TypeTurnFinished }

// Type returns TypeApprovalRequested.
func (*ApprovalRequested) Type() Type { return TypeApprovalRequested }

// Type returns TypeApprovalDecided.
func (*ApprovalDecided) Type() Type { return TypeApprovalDecided }

func (*TurnStarted) payload()        {}
func (*LLMStarted) payload()         {}
func (*LLMDelta) payload()           {}
func (*LLMFinished) payload()        {}
func (*Failover) payload()           {}
func (*ToolStarted) payload()        {}
func (*ToolProgress) payload()       {}
func (*StillWorking) payload()       {}
func (*ToolFinished) payload()       {}
func (*LateResult) payload()         {}
func (*CompactionStarted) payload()  {}
func (*CompactionFinished) payload() {}
func (*TurnFinished) payload()       {}
func (*ApprovalRequested) payload()  {}
func (*ApprovalDecided) payload()    {}

// payloads makes a zero payload of each type, for reading events back.
var payloads = func() map[Type]func() Payload {
	m := map[Type]func() Payload{}
	for _, f := range []func() Payload{
		func() Payload { return &TurnStarted{} },
		func() Payload { return &LLMStarted{} },
		func() Payload { return &LLMDelta{} },
		func() Payload { return &LLMFinished{} },
		func() Payload { return &Failover{} },
		func() Payload { return &ToolStarted{} },
		func() Payload { return &ToolProgress{} },
		func() Payload { return &StillWorking{} },
		func() Payload { return &ToolFinished{} },
		func() Payload { return &LateResult{} },
		func() Payload { return &CompactionStarted{} },
		func() Payload { return &CompactionFinished{} },
		func() Payload { return &TurnFinished{} },
		func() Payload { return &ApprovalRequested{} },
		func() Payload { return &ApprovalDecided{} },
	} {
		m[f().Type()] = f
	}
	return m
}()

// newData returns a zero payload for t, or nil for an unknown type.
func newData(t Type) Payload {
	if f, ok := payloads[t]; ok {
		return f()
	}
	return nil
}

// TypeOf returns the event type of a payload value, or "" if v is not one.
func TypeOf(v any) Type {
	if p, ok := v.(Payload); ok {
		return p.Type()
	}
	return ""
}

type header struct {
	Seq    int64     `json:"seq"`
	TurnID string    `json:"turn_id"`
	Type   Type      `json:"type"`
	At     time.Time `json:"at"`
}

// MarshalJSON writes the event as one flat object, header first.
func (e Event) MarshalJSON() ([]byte, error) {
	if raw, ok := e.Data.(json.RawMessage); ok {
		// An event of a type this version does not know, kept as read:
		// it already holds its header.
		return raw, nil
	}
	h, err := json.Marshal(header{e.Seq, e.TurnID, e.Type, e.At})
	if err != nil {
		return nil, err
	}
	if e.Data == nil {
		return h, nil
	}
	d, err := json.Marshal(e.Data)
	if err != nil {
		return nil, fmt.Errorf("event %s: %w", e.Type, err)
	}
	d = bytes.TrimSpace(d)
	if len(d) < 2 || d[0] != '{' {
		return nil, fmt.Errorf("event %s: payload is not an object", e.Type)
	}
	if len(d) == 2 { // {}
		return h, nil
	}
	out := make([]byte, 0, len(h)+len(d))
	out = append(out, h[:len(h)-1]...)
	out = append(out, ',')
	out = append(out, d[1:]...)
	return out, nil
}

// Marshal returns e as JSON: the bytes json.Marshal(e) returns, without
// json.Marshal's check and copy of what MarshalJSON made. An event with a
// long text — a turn_finished's answer of megabytes — is held as JSON
// once, in a buffer of its exact length, not three times over (issue 29).
func Marshal(e Event) ([]byte, error) {
	if _, ok := e.Data.(json.RawMessage); ok {
		return json.Marshal(e) // as read: json.Marshal compacts it
	}
	if d, ok, err := split(e); err != nil {
		return nil, err
	} else if ok {
		return d.Bytes(), nil
	}
	return e.MarshalJSON()
}

// MarshalDoc returns e as Marshal does, as a document whose long texts
// are not escaped yet: it holds the event's own strings, no copy, and a
// writer escapes each a piece at a time as it writes it (Doc.WriteTo). A
// live turn's frame that no follower reads costs nothing for a turn's
// long answer; one that ten do costs each a piece (issue 29).
func MarshalDoc(e Event) (longjson.Doc, error) {
	if _, ok := e.Data.(json.RawMessage); !ok {
		if d, ok, err := split(e); err != nil || ok {
			return d, err
		}
	}
	b, err := Marshal(e)
	if err != nil {
		return longjson.Doc{}, err
	}
	return longjson.Whole(b), nil
}

// WriteJSON writes e to w as Marshal returns it; a long text goes a piece
// at a time, never whole as JSON in memory.
func WriteJSON(w io.Writer, e Event) error {
	if d, ok, err := split(e); err != nil {
		return err
	} else if ok {
		_, err = d.WriteTo(w)
		return err
	}
	b, err := Marshal(e)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// split returns e's JSON with its long texts apart, when it has one:
// turn_finished's answer and message (an answer's message is the answer),
// tool_finished's result, a delta's text, a late result's output, of
// longjson.Long bytes or more.
func split(e Event) (longjson.Doc, bool, error) {
	var fields []longjson.Field
	switch d := e.Data.(type) {
	case *TurnFinished:
		c := *d
		fields, e.Data = apart(text{"answer", &c.Answer}, text{"message", &c.Message}), &c
	case *ToolFinished:
		c := *d
		fields, e.Data = apart(text{"result", &c.Result}), &c
	case *LLMDelta:
		c := *d
		fields, e.Data = apart(text{"text", &c.Text}), &c
	case *LateResult:
		c := *d
		fields, e.Data = apart(text{"output", &c.Output}), &c
	}
	if len(fields) == 0 {
		return longjson.Doc{}, false, nil
	}
	b, err := e.MarshalJSON()
	if err != nil {
		return longjson.Doc{}, false, err
	}
	d, ok := longjson.Split(b, fields...)
	return d, ok, nil
}

// text is a string field of a payload's copy, by its JSON key.
type text struct {
	key string
	s   *string
}

// apart returns the long texts among ts as fields to write apart, and
// empties them in the copy.
func apart(ts ...text) []longjson.Field {
	var out []longjson.Field
	for _, t := range ts {
		if len(*t.s) >= longjson.Long {
			out = append(out, longjson.Field{Key: t.key, Text: *t.s})
			*t.s = ""
		}
	}
	return out
}

// UnmarshalJSON reads the flat form written by MarshalJSON. The payload of
// an unknown type is kept as a json.RawMessage.
func (e *Event) UnmarshalJSON(b []byte) error {
	var h header
	if err := json.Unmarshal(b, &h); err != nil {
		return err
	}
	e.Seq, e.TurnID, e.Type, e.At = h.Seq, h.TurnID, h.Type, h.At
	d := newData(h.Type)
	if d == nil {
		e.Data = json.RawMessage(append([]byte(nil), b...))
		return nil
	}
	if err := json.Unmarshal(b, d); err != nil {
		return fmt.Errorf("event %s: %w", h.Type, err)
	}
	if tf, ok := d.(*ToolFinished); ok {
		tf.ToolCall.TurnID, tf.TurnID = h.TurnID, ""
	}
	e.Data = d
	return nil
}
