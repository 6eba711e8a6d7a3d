// Package machine is the turn machine of both engines: the state of a turn
// between two units of work (State), the one function that decides what
// the turn does next (Next), and the one loop that drives it (Drive),
// whatever runs the units. The embedded engine (package agent) runs every
// unit in its own process; package temporal runs them as Temporal
// activities, perhaps on other machines, keeping the State in its
// workflow. Either way the decisions — which unit, max_steps, llm_budget,
// max_tool_calls, compaction, how the turn ends — are made here, once.
//
// A State is small on purpose: it travels in a Temporal workflow's history,
// whose payloads are bounded. What grows with the conversation — the
// messages, the summary, the partial answer, the call records — is the
// Transcript's, which an engine keeps in memory or in its store.
//
// The package does no I/O and reads no clock: everything it needs comes in
// through the State and the Driver, so a workflow can call it.
package machine

import (
	"encoding/json"
	"strconv"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
)

// State is a turn between two of its units of work, in a form that can be
// stored and sent as JSON.
type State struct {
	TurnID    string `json:"turn_id"`
	SessionID string `json:"session_id,omitempty"`
	// Start is when the turn began: the turn's ceiling counts from it.
	Start time.Time `json:"start"`
	// Budgets and Limits are the turn's budgets (the agent's with the
	// request's); in JSON, "budgets" lists each knob's value, source and
	// knob by key.
	Budgets budget.Budgets `json:"-"`
	Limits  budget.Limits  `json:"-"`
	// Repaired counts the history messages RepairHistory added or dropped.
	Repaired int `json:"repaired,omitempty"`
	// Agent, when set, is the agent the turn was started with: a unit run
	// by another refuses the turn (an engine whose runner and workers were
	// built from different agent files).
	Agent *AgentRef `json:"agent,omitempty"`
	// TraceParent is the W3C traceparent of the turn's span when the turn
	// is traced: the spans of its model and tool calls, wherever a unit
	// runs them, are its children.
	TraceParent string `json:"trace_parent,omitempty"`
	// TraceCaller is the W3C traceparent of the span the turn's span is a
	// child of (the caller's), when there is one.
	TraceCaller string `json:"trace_caller,omitempty"`

	// Begun is set once turn_started was emitted.
	Begun bool `json:"begun,omitempty"`
	// Steps counts the model steps made; ToolCalls the tool calls run.
	Steps     int `json:"steps"`
	ToolCalls int `json:"tool_calls"`
	// Attempts counts the model call attempts of the step under way, so
	// that a step asked again after its worker was lost numbers its
	// attempts on from the lost ones.
	Attempts int `json:"attempts,omitempty"`
	// CompactAttempts counts the compaction attempts made before the
	// step under way (Steps+1), so that a compaction asked again after
	// its worker was lost numbers its attempt on from the lost ones.
	CompactAttempts int           `json:"compact_attempts,omitempty"`
	LLMUsed         time.Duration `json:"llm_used"`
	ToolTime        time.Duration `json:"tool_time"`
	// ApprovalWait is the time the turn has waited for nothing but
	// people's decisions on its calls: its ceiling is
	// Start+Budgets.Turn+ApprovalWait (Ceiling).
	ApprovalWait time.Duration `json:"approval_wait,omitempty"`
	// IdleStreak counts consecutive llm_idle and llm_first_chunk timeouts.
	IdleStreak int    `json:"idle_streak,omitempty"`
	Failovers  int    `json:"failovers,omitempty"`
	LastStep   string `json:"last_step,omitempty"`
	LastModel  string `json:"last_model,omitempty"`
	// LastProgress is the last progress signal a unit saw: the step
	// watchdog of the next unit counts from it.
	LastProgress time.Time `json:"last_progress,omitzero"`
	// Messages counts the messages the turn added to the conversation so
	// far (the Transcript holds them).
	Messages int `json:"messages"`
	// Seen is, for an engine whose units emit to a store, the seq of the
	// last stored event a model step had seen when it began: the next one
	// looks at what was stored after it for what a lost unit left.
	Seen int64 `json:"seen,omitempty"`

	// History compaction: the summary (in the Transcript) stands for the
	// first CompactedUpTo messages of the conversation.
	Summarised    bool `json:"summarised,omitempty"`
	CompactedUpTo int  `json:"compacted_up_to,omitempty"`
	// SummarisedHere: this turn made the summary (it did not come with
	// the session's history): the turn's messages end with it.
	SummarisedHere    bool   `json:"summarised_here,omitempty"`
	CompactionFailed  *Cause `json:"compaction_failed,omitempty"`
	CompactionTimeout bool   `json:"compaction_timeout,omitempty"`
	// Insufficient: the last compaction left the conversation over
	// compact_at; no compaction is tried before the estimate reaches
	// RetryAt.
	Insufficient bool `json:"insufficient,omitempty"`
	RetryAt      int  `json:"retry_at,omitempty"`
	// CompactDue: the conversation is over compact_at; the model step
	// waits for a compaction. CompactedFor is the step for which a
	// compaction was last considered, so that it is considered once a
	// step.
	CompactDue   bool `json:"compact_due,omitempty"`
	CompactedFor int  `json:"compacted_for,omitempty"`
	// TooLong is the provider's refusal of the last step as too long for
	// the model: the history is compacted (forced) and the step asked
	// again, or the turn stops.
	TooLong *Cause `json:"too_long,omitempty"`

	// Batch are the tool calls the last model step asked for, not yet
	// run; the step's assistant message is the Transcript's last.
	Batch []Call `json:"batch,omitempty"`
	// Refused counts the calls of the last batch max_tool_calls refused.
	Refused int `json:"refused,omitempty"`

	// Stop is what stopped the turn from outside a unit of work: its
	// ceiling, the step watchdog, a cancellation.
	Stop *Cause `json:"stop,omitempty"`
	// Stopped is what the turn was doing when a turn-level budget or a
	// cancellation stopped it.
	Stopped *StopNote `json:"stopped,omitempty"`
	// End is how the turn ends, once a unit decided it.
	End *Ending `json:"end,omitempty"`
	// Suspended is set when the turn was suspended during a batch while
	// it waited for nothing but people (its process stopping): it goes on
	// later, elsewhere perhaps, from Resumed.
	Suspended *Suspension `json:"suspended,omitempty"`
	// Resumed is the suspension a resumed turn's batch goes on from: its
	// calls that ended are not run again, those that waited wait again.
	Resumed *Suspension `json:"resumed,omitempty"`
	// Finished is set once the turn ended: turn_finished emitted, the
	// record made.
	Finished bool `json:"finished,omitempty"`

	// Providers holds the per-conversation state of the chain's providers
	// that keep one (model.Resumable), by the index of the provider's
	// first endpoint in the chain.
	Providers map[int]json.RawMessage `json:"providers,omitempty"`
}

// Ceiling returns when the turn's ceiling falls: its start plus
// timeouts.turn, plus the time it waited for nothing but people
// (docs/decisions/approvals.md).
func (s *State) Ceiling() time.Time {
	return s.Start.Add(s.Budgets.Turn.D + s.ApprovalWait)
}

// Call is one tool call of a batch: the Index-th of the calls the step's
// assistant message asks for (its name and arguments are there).
type Call struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	// Approval, for a call a person approved before it ran, is that wait:
	// its record keeps it.
	Approval *Approved `json:"approval,omitempty"`
	// Waited, for a call of a resumed batch that waited for a person
	// when the batch was suspended, is its request: it waits again
	// without asking again.
	Waited *Asked `json:"waited,omitempty"`
	// Earlier, for a call run again after its worker was lost (a tool
	// that declares retries), is what its earlier runs are known to have
	// done: its record counts them.
	Earlier *Earlier `json:"earlier,omitempty"`
}

// Earlier is what is known of the earlier runs of a call run again after
// its worker was lost: how many there were, when the first started (zero
// if unknown), and the progress reports they made.
type Earlier struct {
	Runs    int       `json:"runs"`
	First   time.Time `json:"first,omitzero"`
	Reports int       `json:"reports,omitempty"`
}

// Approved is the wait of a call for a person's decision, as its record
// keeps it.
type Approved struct {
	event.Approval
	Waited time.Duration `json:"waited"`
}

// Suspension is a batch suspended while it waited for nothing but
// people: when, the calls that waited (by index in the batch) and the
// calls that had ended (their results are in the transcript).
type Suspension struct {
	At      time.Time     `json:"at"`
	Waiting map[int]Asked `json:"waiting"`
	Done    []int         `json:"done,omitempty"`
}

// Asked is a call's request for a person's decision (Units.Ask): what
// approval_requested said, and when the wait ends.
type Asked struct {
	Needed      bool            `json:"needed"`
	CallID      string          `json:"call_id,omitempty"`
	Tool        string          `json:"tool,omitempty"`
	Arguments   json.RawMessage `json:"arguments,omitempty"`
	Round       int             `json:"round,omitempty"`
	RequestedAt time.Time       `json:"requested_at,omitzero"`
	ExpiresAt   time.Time       `json:"expires_at,omitzero"`
	// Began is when the call began waiting, its first round's request.
	Began time.Time `json:"began,omitzero"`
}

// Decision is a decision on an Asked call: event.Approve, event.Deny or
// event.Expired, who made it and when; Stopped when the turn was stopped
// while the call waited.
type Decision struct {
	Decision event.Decision `json:"decision,omitempty"`
	By       string         `json:"by,omitempty"`
	Reason   string         `json:"reason,omitempty"`
	At       time.Time      `json:"at,omitzero"`
	Stopped  bool           `json:"stopped,omitempty"`
}

// CallID names the call in events and records: "call_<step>_<n>", n from 1.
func CallID(step, index int) string {
	return "call_" + strconv.Itoa(step) + "_" + strconv.Itoa(index+1)
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
