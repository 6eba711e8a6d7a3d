package budget

// Status is how a turn ended (spec §5).
type Status string

// The statuses of a turn. Running and Interrupted are states of a stored
// turn: running while it is under way, interrupted when a crash left it
// running.
const (
	StatusRunning     Status = "running"
	StatusCompleted   Status = "completed"
	StatusStopped     Status = "stopped"
	StatusFailed      Status = "failed"
	StatusCancelled   Status = "cancelled"
	StatusInterrupted Status = "interrupted"
)

// StopReason is why a turn ended (spec §5).
type StopReason string

// The stop reasons.
const (
	Answered           StopReason = "answered"
	TurnTimeout        StopReason = "turn_timeout"
	NoProgress         StopReason = "no_progress"
	LLMBudgetExhausted StopReason = "llm_budget_exhausted"
	MaxSteps           StopReason = "max_steps"
	MaxToolCalls       StopReason = "max_tool_calls"
	ModelUnresponsive  StopReason = "model_unresponsive"
	ReplyTooLong       StopReason = "reply_too_long"
	ModelUnavailable   StopReason = "model_unavailable"
	ModelRejected      StopReason = "model_rejected"
	CompactionFailed   StopReason = "compaction_failed"
	Cancelled          StopReason = "cancelled"
	ClientGone         StopReason = "client_gone"
	Shutdown           StopReason = "shutdown"
	Interrupted        StopReason = "interrupted"
	// AgentMismatch: the turn was started for one agent and reached a
	// worker built from another (package temporal); nothing was run.
	AgentMismatch StopReason = "agent_mismatch"
	// EngineLost: the engine running the turn's units (Temporal) was lost
	// — unreachable past its grace, or its workflow gone — so nothing can
	// end the turn but the gateway that noticed.
	EngineLost StopReason = "engine_lost"
)

// Status returns the status that goes with the stop reason.
func (r StopReason) Status() Status {
	switch r {
	case Answered:
		return StatusCompleted
	case ModelUnavailable, ModelRejected, AgentMismatch:
		return StatusFailed
	case Cancelled, ClientGone, Shutdown:
		return StatusCancelled
	case Interrupted, EngineLost:
		return StatusInterrupted
	}
	return StatusStopped
}
