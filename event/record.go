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
	CallID        string             `json:"call_id"`
	TurnID        string             `json:"turn_id"`
	Step          int                `json:"step"`
	Tool          string             `json:"tool"`
	Kind          string             `json:"kind"` // exec, go or mcp
	Arguments     json.RawMessage    `json:"arguments"`
	StartedAt     time.Time          `json:"started_at"`
	EndedAt       time.Time          `json:"ended_at"`
	DurationMS    int64              `json:"duration_ms"`
	TimeoutMS     int64              `json:"timeout_ms"`
	TimeoutSource budget.Source      `json:"timeout_source"`
	IdleTimeoutMS int64              `json:"idle_timeout_ms"`
	Enforcement   budget.Enforcement `json:"enforcement"`
	Outcome       Outcome            `json:"outcome"`
	// Refused is set for a call that was never run, to why: the tool is
	// unknown, its arguments failed the schema, the turn had reached
	// max_tool_calls, or was stopped before the call could start. Such a
	// record has outcome error (cancelled for the last) and no duration.
	Refused string `json:"refused,omitempty"`
	// Phase is set when a budget or a cancellation ended the call: tool,
	// tool_idle, step, turn, cancel.
	Phase         budget.Phase `json:"phase"`
	Overran       bool         `json:"overran"`
	Abandoned     bool         `json:"abandoned"`
	LateResult    bool         `json:"late_result"`
	ProgressCount int          `json:"progress_count"`
	// Runs counts the times the call was run, when more than once: a
	// call of a tool that declares retries, run again after its worker
	// was lost (--engine temporal). FirstStartedAt is then when the first
	// run started; StartedAt, EndedAt and DurationMS are the last run's,
	// and ProgressCount counts the reports of every run.
	Runs           int       `json:"runs,omitempty"`
	FirstStartedAt time.Time `json:"first_started_at,omitzero"`
	ExitCode       *int      `json:"exit_code"`
	StderrTail     string    `json:"stderr_tail"`
	// Result is what the model was given for this call. A result larger
	// than a step's share of context.compact_at is sent to the model cut;
	// Result keeps it whole (docs/decisions/compaction-convergence.md).
	Result    string `json:"result"`
	Truncated bool   `json:"truncated"`
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
	Decision Decision `json:"decision"`
	By       string   `json:"by,omitempty"`
	Reason   string   `json:"reason,omitempty"`
}

// ModelCall is the durable record of one model call attempt (spec §8).
type ModelCall struct {
	Step     int    `json:"step"`
	Model    string `json:"model"`
	Provider string `json:"provider"`
	// Profile names the credential used, never the key itself: the name of
	// the environment variable it came from, or its index.
	Profile      string       `json:"profile"`
	Attempt      int          `json:"attempt"`
	StartedAt    time.Time    `json:"started_at"`
	FirstChunkMS int64        `json:"first_chunk_ms"`
	StreamMS     int64        `json:"stream_ms"`
	Outcome      Outcome      `json:"outcome"`
	Phase        budget.Phase `json:"phase"`
	Error        string       `json:"error"`
	// Compaction is true for a history-compaction call.
	Compaction bool `json:"compaction,omitempty"`
	// InputTokens and OutputTokens are what the provider said the call
	// cost, when it said (omitted otherwise).
	InputTokens  int64 `json:"input_tokens,omitempty"`
	OutputTokens int64 `json:"output_tokens,omitempty"`
}

// Flags are the turn's timeout flags (spec §6).
type Flags struct {
	TimedOutDuringToolExecution bool `json:"timed_out_during_tool_execution,omitempty"`
	TimedOutDuringCompaction    bool `json:"timed_out_during_compaction,omitempty"`
	TimedOutByTurnBudget        bool `json:"timed_out_by_turn_budget,omitempty"`
}

// Totals are a turn's counters.
type Totals struct {
	Steps int `json:"steps"`
	// ToolCalls counts the tool calls that ran (whatever their outcome);
	// ToolCallsRefused those the model asked for that were never run (see
	// ToolCall.Refused).
	ToolCalls        int   `json:"tool_calls"`
	ToolCallsRefused int   `json:"tool_calls_refused"`
	LLMMS            int64 `json:"llm_ms"`
	ToolMS           int64 `json:"tool_ms"`
	WallMS           int64 `json:"wall_ms"`
	Failovers        int   `json:"failovers"`
	// ApprovalMS is the time the turn waited for nothing but people's
	// decisions: part of WallMS, not of the turn's ceiling.
	ApprovalMS int64 `json:"approval_ms,omitempty"`
}

// Turn is the durable record of one turn (spec §8).
type Turn struct {
	TurnID     string            `json:"turn_id"`
	SessionID  string            `json:"session_id,omitempty"`
	Agent      string            `json:"agent,omitempty"`
	Input      string            `json:"input"`
	Status     budget.Status     `json:"status"`
	StopReason budget.StopReason `json:"stop_reason"`
	Message    string            `json:"message"`
	Answer     string            `json:"answer"`
	Flags      Flags             `json:"flags"`
	StartedAt  time.Time         `json:"started_at"`
	EndedAt    time.Time         `json:"ended_at"`
	Steps      int               `json:"steps"`
	LLMMS      int64             `json:"llm_ms"`
	ToolMS     int64             `json:"tool_ms"`
	WallMS     int64             `json:"wall_ms"`
	// ApprovalMS is the part of WallMS the turn waited for nothing but
	// people's decisions (Totals.ApprovalMS).
	ApprovalMS int64       `json:"approval_ms,omitempty"`
	Failovers  int         `json:"failovers"`
	ToolCalls  []ToolCall  `json:"tool_calls"`
	ModelCalls []ModelCall `json:"model_calls"`
	Events     []Event     `json:"events,omitempty"`
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
