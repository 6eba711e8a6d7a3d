package event

import (
	"bytes"
	"encoding/json"
	"io"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/longjson"
)

// Outcome is how one tool call or model call ended.
type Outcome string

// The outcomes of a call (spec §7).
const (
	OutcomeOK        Outcome = "ok"
	OutcomeError     Outcome = "error"
	OutcomeTimedOut  Outcome = "timed_out"
	OutcomeCancelled Outcome = "cancelled"
	OutcomeAbandoned Outcome = "abandoned"
	// OutcomeInsufficient is a compaction that worked but left the
	// conversation over context.compact_at (compaction_finished and the
	// compaction's model call record).
	OutcomeInsufficient Outcome = "insufficient"
	// OutcomeInterrupted is a call whose timebox process died (killed,
	// crashed) before the call ended. Its record is written by the next
	// process to open the store, from the call's events; its duration is
	// a lower bound.
	OutcomeInterrupted Outcome = "interrupted"
	// OutcomeDenied is a call a person denied: it was not run, and the
	// model was told (tool_denied).
	OutcomeDenied Outcome = "denied"
	// OutcomeApprovalExpired is a call that got no decision within its
	// approval timeout: it was not run (phase approval).
	OutcomeApprovalExpired Outcome = "approval_expired"
)

// RefusedUnknownTool is ToolCall.Refused for a call of a tool the agent
// does not have: its Tool is whatever name the model wrote.
const RefusedUnknownTool = "unknown_tool"

// ToolCall is the durable record of one tool call (spec §8).
type ToolCall struct {
	// CallID (call_id) names the call, unique in the turn.
	CallID string `json:"call_id"`
	// TurnID (turn_id) is the turn the call belongs to.
	TurnID string `json:"turn_id"`
	// Step is the step whose model reply asked for the call, from 1.
	Step int `json:"step"`
	// Tool is the tool's name; for a call of an unknown tool, the name
	// the model wrote.
	Tool string `json:"tool"`
	Kind string `json:"kind"` // exec, go or mcp
	// Arguments are the arguments the model sent (JSON).
	Arguments json.RawMessage `json:"arguments"`
	// StartedAt and EndedAt (started_at, ended_at) are when the call
	// started and ended; DurationMS (duration_ms) is how long it ran, in
	// milliseconds. A refused call has no duration.
	StartedAt  time.Time `json:"started_at"`
	EndedAt    time.Time `json:"ended_at"`
	DurationMS int64     `json:"duration_ms"`
	// TimeoutMS (timeout_ms) is the call's timeout in milliseconds, and
	// TimeoutSource (timeout_source) where it came from: the same value as
	// the call's tool_started source, named for the record.
	TimeoutMS     int64         `json:"timeout_ms"`
	TimeoutSource budget.Source `json:"timeout_source"`
	// IdleTimeoutMS (idle_timeout_ms) is the call's idle timeout in
	// milliseconds; 0 is off.
	IdleTimeoutMS int64 `json:"idle_timeout_ms"`
	// Enforcement is how the call's timeout was enforced: hard,
	// cooperative or advisory.
	Enforcement budget.Enforcement `json:"enforcement"`
	// Outcome is how the call ended.
	Outcome Outcome `json:"outcome"`
	// Refused is set for a call that was never run, to why: the tool is
	// unknown, its arguments failed the schema, the turn had reached
	// max_tool_calls, or was stopped before the call could start. Such a
	// record has outcome error (cancelled for the last) and no duration.
	Refused string `json:"refused,omitempty"`
	// Phase is set when a budget or a cancellation ended the call: tool,
	// tool_idle, step, turn, cancel.
	Phase budget.Phase `json:"phase"`
	// Overran is set for an advisory call that ran past its timeout; its
	// result was used.
	Overran bool `json:"overran"`
	// Abandoned is set for a cooperative call that did not return within
	// timeouts.kill_grace after it was stopped: the turn went on without it.
	Abandoned bool `json:"abandoned"`
	// LateResult (late_result) is set for an abandoned call that returned
	// later; its output is LateOutput.
	LateResult bool `json:"late_result"`
	// ProgressCount (progress_count) is how many progress reports the call
	// made, every one counted, coalesced or not.
	ProgressCount int `json:"progress_count"`
	// Runs counts the times the call was run, when more than once: a
	// call of a tool that declares retries, run again after its worker
	// was lost (--engine temporal). FirstStartedAt is then when the first
	// run started; StartedAt, EndedAt and DurationMS are the last run's,
	// and ProgressCount counts the reports of every run.
	Runs           int       `json:"runs,omitempty"`
	FirstStartedAt time.Time `json:"first_started_at,omitzero"`
	// ExitCode is an exec tool's exit status; nil (null) when it was
	// killed, and for go and mcp tools.
	ExitCode *int `json:"exit_code"`
	// StderrTail (stderr_tail) is the end of an exec tool's stderr, its log
	// without ::progress:: lines; empty when there is none.
	StderrTail string `json:"stderr_tail"`
	// Result is what the model was given for this call. A result larger
	// than a step's share of context.compact_at is sent to the model cut;
	// Result keeps it whole (docs/decisions/compaction-convergence.md).
	Result string `json:"result"`
	// Truncated is set when the tool's output was cut at
	// limits.max_tool_output.
	Truncated bool `json:"truncated"`
	// LateOutput is what an abandoned call returned after it was
	// abandoned; it was never given to the model.
	LateOutput string `json:"late_output,omitempty"`
	// ServerRestarted is set for a stopped call of an MCP server that had
	// not answered the call's cancellation within timeouts.kill_grace and
	// was restarted for it (mcp.on_ignored_cancel: restart); StderrTail
	// says so.
	ServerRestarted bool `json:"server_restarted,omitempty"`
	// NoticedAt is set for a call lost with its worker (outcome
	// interrupted, phase worker_lost): when the loss was noticed. Its
	// EndedAt and DurationMS say what is known it ran: until its last
	// heartbeat.
	NoticedAt time.Time `json:"noticed_at,omitzero"`
	// ApprovalMS is how long the call waited for a person's decision
	// before it ran (or was denied, or expired): apart from DurationMS,
	// which counts from the tool's start. Approval is the decision.
	ApprovalMS int64     `json:"approval_ms,omitempty"`
	Approval   *Approval `json:"approval,omitempty"`
}

// Approval is the decision on a call that waited for one, as its record
// keeps it.
type Approval struct {
	// Decision is approve, deny or expired.
	Decision Decision `json:"decision"`
	// By is who decided; empty (omitted) for an expiry.
	By string `json:"by,omitempty"`
	// Reason is why, in their words; empty (omitted) when none was given.
	Reason string `json:"reason,omitempty"`
}

// ModelCall is the durable record of one model call attempt (spec §8).
type ModelCall struct {
	// Step is the step the attempt belongs to, from 1.
	Step int `json:"step"`
	// Model is the model's name.
	Model string `json:"model"`
	// Provider is openai, anthropic or script.
	Provider string `json:"provider"`
	// Profile names the credential used, never the key itself: the name of
	// the environment variable it came from, or its index.
	// It is empty for the script model.
	Profile string `json:"profile"`
	// Attempt is the attempt within the step, from 1.
	Attempt int `json:"attempt"`
	// StartedAt (started_at) is when the request was sent.
	StartedAt time.Time `json:"started_at"`
	// FirstChunkMS (first_chunk_ms) is the time from the request to the
	// stream's first chunk, and StreamMS (stream_ms) to the end of the
	// stream or its failure, in milliseconds.
	FirstChunkMS int64 `json:"first_chunk_ms"`
	StreamMS     int64 `json:"stream_ms"`
	// Outcome is how the attempt ended.
	Outcome Outcome `json:"outcome"`
	// Phase is the phase of the failure (llm_first_chunk, llm_idle,
	// llm_http, …); empty when the attempt succeeded.
	Phase budget.Phase `json:"phase"`
	// Error is the failure; empty when the attempt succeeded.
	Error string `json:"error"`
	// Compaction is true for a history-compaction call.
	Compaction bool `json:"compaction,omitempty"`
	// InputTokens and OutputTokens are what the provider said the call
	// cost, when it said (omitted otherwise).
	InputTokens  int64 `json:"input_tokens,omitempty"`
	OutputTokens int64 `json:"output_tokens,omitempty"`
}

// Flags are the turn's timeout flags (spec §6).
// Each is set when a turn-level budget fired, and omitted when false.
type Flags struct {
	// TimedOutDuringToolExecution is set when timeouts.step or
	// timeouts.turn fired while a tool call was running.
	TimedOutDuringToolExecution bool `json:"timed_out_during_tool_execution,omitempty"`
	// TimedOutDuringCompaction is set when a budget fired during a
	// history compaction.
	TimedOutDuringCompaction bool `json:"timed_out_during_compaction,omitempty"`
	// TimedOutByTurnBudget is set when timeouts.turn ended the turn.
	TimedOutByTurnBudget bool `json:"timed_out_by_turn_budget,omitempty"`
}

// Totals are a turn's counters, as turn_finished carries them.
type Totals struct {
	// Steps counts the model calls made.
	Steps int `json:"steps"`
	// ToolCalls counts the tool calls that ran (whatever their outcome);
	// ToolCallsRefused those the model asked for that were never run (see
	// ToolCall.Refused).
	ToolCalls        int `json:"tool_calls"`
	ToolCallsRefused int `json:"tool_calls_refused"`
	// LLMMS (llm_ms) is the time spent streaming model replies, what
	// timeouts.llm_budget counts; ToolMS (tool_ms) the time spent running
	// tool batches (a batch of concurrent calls counts once); WallMS
	// (wall_ms) the turn's wall clock. All are in milliseconds.
	LLMMS  int64 `json:"llm_ms"`
	ToolMS int64 `json:"tool_ms"`
	WallMS int64 `json:"wall_ms"`
	// Failovers counts the attempts that failed over.
	Failovers int `json:"failovers"`
	// ApprovalMS is the time the turn waited for nothing but people's
	// decisions: part of WallMS, not of the turn's ceiling.
	ApprovalMS int64 `json:"approval_ms,omitempty"`
}

// Turn is the durable record of one turn (spec §8).
type Turn struct {
	// TurnID (turn_id) names the turn.
	TurnID string `json:"turn_id"`
	// SessionID (session_id) names the conversation; empty (omitted) for a
	// turn outside one.
	SessionID string `json:"session_id,omitempty"`
	// Agent is the agent's name; empty (omitted) when it has none.
	Agent string `json:"agent,omitempty"`
	// Input is the user's message.
	Input string `json:"input"`
	// Status is running until the turn ends, then completed, stopped,
	// failed, cancelled or interrupted.
	Status budget.Status `json:"status"`
	// StopReason (stop_reason) says why the turn ended; empty while it
	// runs.
	StopReason budget.StopReason `json:"stop_reason"`
	// Message is the closing message for the person waiting, as in
	// turn_finished; the answer itself for a completed turn.
	Message string `json:"message"`
	// Answer is the answer, or the partial answer of a turn that did not
	// complete.
	Answer string `json:"answer"`
	// Flags are the turn's timeout flags.
	Flags Flags `json:"flags"`
	// StartedAt and EndedAt (started_at, ended_at) are when the turn
	// started and ended.
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at"`
	// Steps counts the model calls made; LLMMS, ToolMS and WallMS are the
	// turn's streaming, tool and wall-clock times in milliseconds, as in
	// Totals.
	Steps  int   `json:"steps"`
	LLMMS  int64 `json:"llm_ms"`
	ToolMS int64 `json:"tool_ms"`
	WallMS int64 `json:"wall_ms"`
	// ApprovalMS is the part of WallMS the turn waited for nothing but
	// people's decisions (Totals.ApprovalMS).
	ApprovalMS int64 `json:"approval_ms,omitempty"`
	// Failovers counts the attempts that failed over.
	Failovers int `json:"failovers"`
	// ToolCalls (tool_calls) are the records of every tool call, refused
	// ones included, in the order the calls started.
	ToolCalls []ToolCall `json:"tool_calls"`
	// ModelCalls (model_calls) are the records of every model call
	// attempt, compaction calls included.
	ModelCalls []ModelCall `json:"model_calls"`
	// Events are the turn's events in order; empty (omitted) where a
	// surface does not include them.
	Events []Event `json:"events,omitempty"`
}

// Totals returns the turn's counters as turn_finished carries them.
func (t *Turn) Totals() Totals {
	tot := Totals{Steps: t.Steps, LLMMS: t.LLMMS, ToolMS: t.ToolMS, WallMS: t.WallMS, Failovers: t.Failovers, ApprovalMS: t.ApprovalMS}
	for _, c := range t.ToolCalls {
		if c.Refused != "" {
			tot.ToolCallsRefused++
		} else {
			tot.ToolCalls++
		}
	}
	return tot
}

// MarshalTurn returns rec as JSON: the bytes json.Marshal(rec) returns. A
// record without events is made in one buffer of its exact length, its
// answer escaped into it: a long answer is held as JSON once, not three
// times over (issue 29).
func MarshalTurn(rec *Turn) ([]byte, error) {
	if len(rec.Events) > 0 {
		var b bytes.Buffer
		err := WriteTurn(&b, rec)
		return b.Bytes(), err
	}
	d, err := turnDoc(rec)
	if err != nil {
		return nil, err
	}
	return d.Bytes(), nil
}

// WriteTurn writes rec to w as json.Marshal(rec) returns it, its answer a
// piece at a time and its events one at a time (WriteJSON): a long
// reply's record — its answer, its every delta — is never held whole as
// JSON. It writes in many small pieces: give it a buffered w.
func WriteTurn(w io.Writer, rec *Turn) error {
	d, err := turnDoc(rec)
	if err != nil {
		return err
	}
	if len(rec.Events) == 0 {
		_, err = d.WriteTo(w)
		return err
	}
	// Events is the record's last field; the record has fields, never {}.
	if _, err := d.Trim(1).WriteTo(w); err != nil {
		return err
	}
	if _, err := io.WriteString(w, `,"events":[`); err != nil {
		return err
	}
	for i, e := range rec.Events {
		if i > 0 {
			if _, err := io.WriteString(w, ","); err != nil {
				return err
			}
		}
		if err := WriteJSON(w, e); err != nil {
			return err
		}
	}
	_, err = io.WriteString(w, "]}")
	return err
}

// turnDoc is rec's JSON without its events, its answer and message apart
// when long (an answer's message is the answer).
func turnDoc(rec *Turn) (longjson.Doc, error) {
	r := *rec
	r.Events = nil
	if fields := apart(text{"answer", &r.Answer}, text{"message", &r.Message}); len(fields) > 0 {
		b, err := json.Marshal(&r)
		if err != nil {
			return longjson.Doc{}, err
		}
		if d, ok := longjson.Split(b, fields...); ok {
			return d, nil
		}
		r.Answer, r.Message = rec.Answer, rec.Message
	}
	b, err := json.Marshal(&r)
	return longjson.Whole(b), err
}

// LostCall is a tool call that was running when the process running its
// turn died, and that the turn's end recorded interrupted: the span of
// that process died with it, and is made again (agent.TraceEnded) with the
// ids its tool_started carries.
type LostCall struct {
	// Started is the call's tool_started, whose Traceparent names its
	// span; Record is the call's record as the end stored it.
	Started *ToolStarted
	Record  ToolCall
}

// LostCalls pairs each of calls with its tool_started among events; a
// call with none (it never started) is left out.
func LostCalls(events []Event, calls []ToolCall) []LostCall {
	starts := map[string]*ToolStarted{}
	for _, e := range events {
		if d, ok := e.Data.(*ToolStarted); ok {
			starts[d.CallID] = d
		}
	}
	var out []LostCall
	for _, c := range calls {
		if d := starts[c.CallID]; d != nil {
			out = append(out, LostCall{Started: d, Record: c})
		}
	}
	return out
}

// LostAttempt is a model attempt that was under way when the process
// running its turn died: its llm_started is stored and its llm_finished
// is not. Its chat span died with that process, and is made again
// (agent.TraceEnded) with the ids its llm_started carries, those its model
// request was sent as its traceparent header.
//
// A compaction under way is one too: its compaction_started carries its
// span's ids the same way.
type LostAttempt struct {
	// Started is the attempt's llm_started, nil for a compaction; At is
	// when it (or Compaction) was stored.
	Started *LLMStarted
	At      time.Time
	// Compaction is the compaction's compaction_started, for a compaction
	// under way; nil for a model attempt.
	Compaction *CompactionStarted
	// Until is as long as the attempt is known to have run: the turn's
	// last stored event (its reply's last delta, a still_working), to
	// which the turn's llm_ms counts it too. Nothing of it is known after.
	Until time.Time
}
