package machine

import "github.com/timebox-run/timebox/budget"

// Kind is what a unit of work does.
type Kind int

// The units of work of a turn.
const (
	// Begin begins the turn: turn_started.
	Begin Kind = iota + 1
	// Think makes a model step: the model call with its failover, after
	// noting whether the conversation must be compacted first.
	Think
	// Compact summarises older history (Unit.Force: because the provider
	// refused the last step as too long).
	Compact
	// Tools runs a batch of tool calls, up to parallel_tools at once.
	Tools
	// End ends the turn (Unit.End says how): turn_finished and the record.
	End
	// Suspend stops driving a turn suspended while it waited for nothing
	// but people (State.Suspended): it goes on later from its state.
	Suspend
)

func (k Kind) String() string {
	switch k {
	case Begin:
		return "begin"
	case Think:
		return "think"
	case Compact:
		return "compact"
	case Tools:
		return "tools"
	case End:
		return "end"
	case Suspend:
		return "suspend"
	}
	return "unknown"
}

// Unit is the unit of work a turn does next.
type Unit struct {
	Kind Kind `json:"kind"`
	// Step is the model step the unit belongs to: the step a Think makes,
	// the step whose calls a Tools runs.
	Step int `json:"step,omitempty"`
	// Force, for Compact: the provider refused the step as too long.
	Force bool `json:"force,omitempty"`
	// Calls, for Tools: the batch.
	Calls []Call `json:"calls,omitempty"`
	// End, for End: how the turn ends.
	End *Ending `json:"end,omitempty"`
}

// Ending is how a turn ends.
type Ending struct {
	Reason budget.StopReason `json:"reason"`
	Cause  *Cause            `json:"cause,omitempty"`
	// Message follows the stop's own sentence in the closing message: the
	// failed attempts of the last model step.
	Message string `json:"message,omitempty"`
	// Refused counts the calls max_tool_calls refused.
	Refused int `json:"refused,omitempty"`
	// Empty, when every failed attempt of the last model step returned
	// nothing, counts them; OutOfTokens: one of them spent its whole
	// output allowance first.
	Empty       int  `json:"empty,omitempty"`
	OutOfTokens bool `json:"out_of_tokens,omitempty"`
}

// Next returns the unit of work the turn of s does next. It is the one
// place where a turn's course is decided, for every engine: it reads only
// s, so that a Temporal workflow may call it.
//
// The order is that of the turn: an end a unit decided; the tool calls
// the last step asked for (each gets a record, refused when the turn was
// stopped meanwhile); a stop from outside; the beginning (a turn ended
// before it began is begun by its End); max_tool_calls; a step
// refused as too long (compact and ask again); max_steps; llm_budget; a
// compaction due; then the next model step.
func Next(s *State) Unit {
	switch {
	case s.End != nil:
		return Unit{Kind: End, End: s.End}
	case s.Suspended != nil:
		return Unit{Kind: Suspend}
	case len(s.Batch) > 0:
		return Unit{Kind: Tools, Step: s.Steps, Calls: s.Batch}
	case s.Stop != nil:
		return Unit{Kind: End, End: &Ending{Reason: StopReasonOf(s.Stop.Err()), Cause: s.Stop}}
	case !s.Begun:
		return Unit{Kind: Begin}
	case s.Refused > 0:
		return Unit{Kind: End, End: &Ending{Reason: budget.MaxToolCalls, Refused: s.Refused}}
	case s.TooLong != nil:
		return Unit{Kind: Compact, Step: s.Steps + 1, Force: true}
	case int64(s.Steps) >= s.Limits.MaxSteps.N:
		return Unit{Kind: End, End: &Ending{Reason: budget.MaxSteps}}
	case !s.Budgets.LLMBudget.Off() && s.LLMUsed >= s.Budgets.LLMBudget.D:
		return Unit{Kind: End, End: &Ending{Reason: budget.LLMBudgetExhausted}}
	case s.CompactDue:
		return Unit{Kind: Compact, Step: s.Steps + 1}
	}
	return Unit{Kind: Think, Step: s.Steps + 1}
}
