package machine

import (
	"context"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
)

// AgentRef says which agent a turn was started with, so that a worker
// built from another agent refuses it rather than run it.
type AgentRef struct {
	Name string `json:"name,omitempty"`
	// Origin is where the agent was defined, for messages: its agent
	// file's path.
	Origin string `json:"origin,omitempty"`
	// Fingerprint is a digest of what makes the agent: its instructions,
	// model chain, tools with their own budgets. Turn-level budgets are
	// not in it: they travel with the turn.
	Fingerprint string `json:"fingerprint"`
	// Context says the agent's context settings (compact_at, time_notes),
	// which the fingerprint holds too, for a mismatch's message.
	Context string `json:"context,omitempty"`
}

// Units are the units of work of an agent's turns, run in this process:
// package agent's, for an engine that runs each unit where it chooses
// (package temporal). Each takes the state of the turn and its transcript,
// runs under the turn's watchdogs (its ceiling counted from State.Start,
// the step window from State.LastProgress, ctx's cancellation), emits its
// events to sinks, and updates the state.
type Units interface {
	// Ref is the agent's.
	Ref() AgentRef
	// NewState returns the state of a turn that begins now for the agent:
	// its budgets (the agent's, with req's), and the history repaired.
	NewState(turnID, sessionID string, history []model.Message, req budget.Request) (*State, []model.Message)
	// ToolBudget returns the budget of the named tool's calls in the turn
	// of s, its retries, and whether the agent has the tool.
	ToolBudget(s *State, name string) (b budget.ToolBudget, retries int, ok bool)
	// Advance runs units of s until the next is a batch of tool calls or
	// the end (machine.Advance). When a unit decided the end, it ends the
	// turn too and returns how; a stop from outside (State.Stop) is left
	// to the engine's End.
	Advance(ctx context.Context, s *State, tr Transcript, sinks ...event.Sink) *Ended
	// Call runs call c of step's batch; s is the state the batch began
	// with, and is not changed.
	Call(ctx context.Context, s *State, step int, c Call, tr Transcript, sinks ...event.Sink) Called
	// Refuse records calls cs of step's batch as not run (Refused*), in
	// their order, and returns how each went.
	Refuse(s *State, step int, cs []Call, reason string, tr Transcript, sinks ...event.Sink) []Called
	// Lost records call c, which ran where it was lost (a worker that
	// died), unless its record reached the store (Loss.Recorded).
	Lost(s *State, step int, c Call, l Loss, tr Transcript, sinks ...event.Sink) Called
	// LostAttempts records the model call attempts of step that began
	// where they were lost (their worker died mid-step): outcome
	// interrupted, phase worker_lost. A lost compaction is recorded as a
	// compaction (compaction_finished), of its own step.
	LostAttempts(s *State, step int, lost []LostAttempt, why string, sinks ...event.Sink)
	// StillWorking emits the still_working of a beat at now for calls
	// running elsewhere (an engine whose calls run as units of their own
	// keeps the beat of their batch), by the rule of every turn: one
	// notice naming each silent call, none when none is.
	StillWorking(s *State, calls []Running, now time.Time, sinks ...event.Sink)
	// End ends the turn as e says.
	End(s *State, e Ending, tr Transcript, sinks ...event.Sink) *Ended
	// TurnSpan begins, for the process about to store the end of the
	// turn of s, the turn's span with the ids its runner began it with
	// (State.TraceParent), and returns the function that ends it with the
	// turn's final record once that is stored; nil when this process
	// cannot make that span. An engine whose runner may be gone when the
	// turn ends, or no longer follow it, has the one that stores a turn's
	// end make its span.
	TurnSpan(s *State) func(rec *event.Turn)
	// AsksApproval reports whether the named tool's calls may need a
	// person's decision (Ask decides for each call).
	AsksApproval(name string) bool
	// Ask has call c of step's batch ask for a person's decision (round
	// from 1), when its tool needs one for its arguments: record, when
	// not nil, keeps the request (a store shared with those who decide)
	// before approval_requested is emitted. began is when the call began
	// waiting (its first round), zero for the first. A request that
	// record refuses is denied at once (Asked.Needed with a Decision).
	Ask(ctx context.Context, s *State, step int, c Call, round int, began time.Time, record func(context.Context, Asked) error,
		tr Transcript, sinks ...event.Sink) (Asked, *Decision)
	// Decided ends the wait of a with d (approval_decided) and reports
	// whether the call runs, or whether it is to be asked again (an
	// approval too old to act on). A call that does not run is recorded
	// and the model told; out carries an approved call's wait.
	Decided(s *State, step int, c Call, a Asked, d Decision, tr Transcript, sinks ...event.Sink) (run, again bool, out Called)
}

// Ended is a turn that ended.
type Ended struct {
	Record   *event.Turn
	Messages []model.Message
}

// Loss is what is known of a call that was running where it was lost.
type Loss struct {
	// Why says what was lost: "worker w1 stopped sending heartbeats".
	Why string
	// Started is when the call started, zero if it is not known to have;
	// Ran is how long it was known to run: until its last heartbeat.
	Started time.Time
	Ran     time.Duration
	// Noticed is when the loss was noticed.
	Noticed time.Time
	// Recorded is the call's record, when it reached the store before the
	// loss: the call ended, and only its report was lost.
	Recorded *event.ToolCall
	// Runs counts the times the call was run, the lost one included: more
	// than 1 for a tool that declares retries. First is when the first
	// run started (zero if unknown); Reports counts the progress reports
	// all of them made, as far as their heartbeats said.
	Runs    int
	First   time.Time
	Reports int
	// Traceparent is the traceparent the call's tool_started named: the
	// ids of the span its worker began, which died with it, and which
	// the span made of the loss takes; "" when unknown or untraced.
	Traceparent string
}

// LostAttempt is a model call attempt that began where it was lost: its
// llm_started, and when it was last heard from (its last llm_delta stored;
// zero: none came); or a compaction's compaction_started (Compaction, with
// the step and the estimate it began with).
type LostAttempt struct {
	Step            int       `json:"step,omitempty"`
	Compaction      bool      `json:"compaction,omitempty"`
	EstimatedTokens int       `json:"estimated_tokens,omitempty"`
	Attempt         int       `json:"attempt"`
	Model           string    `json:"model"`
	Provider        string    `json:"provider"`
	Profile         string    `json:"profile,omitempty"`
	Started         time.Time `json:"started"`
	Last            time.Time `json:"last,omitzero"`
	// Traceparent is the traceparent the attempt's llm_started (a
	// compaction's compaction_started) named: the ids of the chat span its
	// worker began, which died with it, and which the span made of the
	// loss takes; "" when untraced.
	Traceparent string `json:"traceparent,omitempty"`
}

// Running is a tool call of a batch that runs, as its events say: its
// tool_started and its last tool_progress.
type Running struct {
	Step       int
	CallID     string
	Tool       string
	Started    time.Time
	Limit      time.Duration
	LastReport time.Time // zero when it reported none
}

// unitsOf returns the Units of an agent; package agent sets it.
var unitsOf func(agent any) (Units, bool)

// SetUnits is how package agent gives engines its units: the machinery
// stays out of its API (engines are internal; programs use Run).
func SetUnits(f func(agent any) (Units, bool)) { unitsOf = f }

// UnitsOf returns the units of agent, an *agent.Agent.
func UnitsOf(agent any) (Units, bool) {
	if unitsOf == nil {
		return nil, false
	}
	return unitsOf(agent)
}
