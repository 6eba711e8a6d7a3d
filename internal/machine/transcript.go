package machine

import (
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
)

// Transcript holds what of a turn grows with its conversation, which a
// State only counts: the user's message and the session's history, the
// messages the turn added, the compaction summary, the partial answer.
// The embedded engine keeps it in memory; package temporal in its store,
// so that no payload limit bounds a conversation.
//
// Put may be called by the calls of one batch at once; the rest by one
// unit at a time.
type Transcript interface {
	// Input is the user's message.
	Input() string
	// History is the session's conversation before the turn, repaired.
	History() []model.Message
	// Messages are the messages the turn added so far (State.Messages of
	// them); Message(i) is the i-th, from 0 (the user's message).
	Messages() []model.Message
	Message(i int) model.Message
	// Put sets message i: the next one, or one of a batch's results.
	Put(i int, m model.Message)
	// Summary is the compaction summary (State.Summarised).
	Summary() string
	SetSummary(s string)
	// Partial is what the last model attempt streamed: a stopped turn's
	// partial answer.
	Partial() string
	SetPartial(s string)
	// Records are the turn's call records so far, every one, for its end,
	// when its units ran elsewhere (the store has them); ok is false where
	// the turn keeps them itself.
	Records() (tools []event.ToolCall, models []event.ModelCall, ok bool)
}
