// Package model defines what a model provider is to timebox — a streaming
// chat endpoint that may ask for tool calls — and watches every stream with
// the first-chunk and idle budgets (spec §2, §6).
//
// Providers live in their own packages (model/script, model/openai,
// model/anthropic) so the heavy SDKs stay out of everything else.
package model

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/timebox-run/timebox/budget"
)

// Role is the author of a message.
type Role string

// The roles of a conversation.
const (
	RoleUser      Role = "user"
	RoleAssistant Role = "assistant"
	RoleTool      Role = "tool"
	// RoleSummary is a session's note, kept in its history, that a history
	// compaction summarised the conversation before it: its Content is the
	// summary, Covers how many messages it stands for. It is never sent to
	// a provider as a message: the next turn of the session starts from
	// it (agent.SplitSummary).
	RoleSummary Role = "summary"
)

// Message is one message of a conversation.
type Message struct {
	// Role says who speaks: user, assistant, tool, or summary.
	Role Role `json:"role"`
	// Content is the message's text: the user's input, the model's reply
	// text, a tool call's result, or a compaction's summary.
	Content string `json:"content"`
	// ToolCalls are the calls an assistant message asked for.
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID and ToolName identify the call a tool message answers.
	ToolCallID string `json:"tool_call_id,omitempty"`
	ToolName   string `json:"tool_name,omitempty"`
	// Covers, on a RoleSummary message, is how many messages of the
	// conversation before it (not counting summaries) the summary stands
	// for.
	Covers int `json:"covers,omitempty"`
}

// ToolCall is a call the model asked for. Arguments are the raw text the
// model sent, which may not be JSON.
type ToolCall struct {
	// ID is the id the provider gave the call, which the tool message
	// answering it repeats (Message.ToolCallID).
	ID string `json:"id"`
	// Name is the tool's name as the model wrote it.
	Name string `json:"name"`
	// Arguments is the arguments' raw text.
	Arguments string `json:"arguments"`
}

// ToolDef is a tool as the model is told of it.
type ToolDef struct {
	// Name is the tool's name, and Description what it does (with its
	// budget, when time notes are on).
	Name        string `json:"name"`
	Description string `json:"description"`
	// Parameters is the JSON Schema of the tool's arguments; empty
	// (omitted) for any object.
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// Request is one model call.
type Request struct {
	// Model is the provider's model name ("gpt-4o-mini").
	Model string
	// System is the agent's instructions.
	System string
	// Messages are the conversation so far, oldest first.
	Messages []Message
	// Tools are the tools the model may call; empty for none.
	Tools []ToolDef
	// Conversation identifies the conversation the call belongs to (the
	// session); the script provider keeps its place per conversation.
	Conversation string
	// Compaction marks a history-compaction call: Messages hold the older
	// conversation as one transcript and the reply is its summary. The
	// script provider answers it apart from the turn's own replies.
	Compaction bool
	// TimeNote, when set, is a short note of the turn's time and tool
	// calls left (context.time_notes). It is sent after the whole
	// conversation, so that the prefix the provider caches (system prompt,
	// tools, earlier messages) stays the same from one request of a turn to
	// the next: OpenAI as a system message after the last message,
	// Anthropic as a text block ending the last user turn. It is not a
	// message of the conversation and is never stored in it.
	TimeNote string
	// TraceParent is the W3C traceparent of the call's span, when the turn
	// is traced: the providers send it as the traceparent header, so that
	// a traced model server joins the turn's trace.
	TraceParent string
	// TextKept says the caller keeps the text the stream's chunks carry:
	// the stream may then leave it out of its Response (Text empty), so
	// that a long reply is not held twice while it streams (issue 29).
	// The turn sets it; the OpenAI and Anthropic streams heed it.
	TextKept bool
}

// Chunk is one piece of a streamed reply. Every chunk is a progress signal,
// even one with no text (a tool-call argument fragment, a keep-alive
// carrying data).
type Chunk struct {
	// Text is the reply text the chunk carried; empty for a chunk that
	// carried none.
	Text string
	// ToolBytes is how many bytes of tool-call names and arguments the
	// chunk carried, which count toward limits.max_reply with the text.
	ToolBytes int
}

// Size returns what the chunk adds to its reply's size (limits.max_reply).
func (c Chunk) Size() int64 { return int64(len(c.Text) + c.ToolBytes) }

// Response is a complete reply.
type Response struct {
	// Text is the reply's text; empty when the request said TextKept and
	// the stream left it out.
	Text string
	// ToolCalls are the calls the reply asks for, in order.
	ToolCalls []ToolCall
	// FinishReason is why the provider said the reply ended ("stop",
	// "tool_calls", "end_turn", …); empty when it did not say.
	FinishReason string
	// Usage is what the provider said the call cost; zero when it said
	// nothing.
	Usage Usage
}

// Usage is a model call's cost in tokens, as its provider reported it.
type Usage struct {
	// InputTokens is the prompt's tokens and OutputTokens the reply's; 0
	// when the provider did not say.
	InputTokens  int64
	OutputTokens int64
}

// Size returns the reply's size as limits.max_reply counts it: its text
// plus its tool calls' names and arguments.
func (r Response) Size() int64 {
	n := int64(len(r.Text))
	for _, c := range r.ToolCalls {
		n += int64(len(c.Name) + len(c.Arguments))
	}
	return n
}

// Empty reports whether the reply has nothing for anyone: no tool call, and
// no text but white space.
func (r Response) Empty() bool {
	return len(r.ToolCalls) == 0 && strings.TrimSpace(r.Text) == ""
}

// Stream is one streaming reply. Recv returns the next chunk, and io.EOF
// once the reply is complete, after which Response is valid. Recv must
// return promptly once the context the stream was opened with is done.
// Close releases the stream; it is safe to call more than once.
type Stream interface {
	Recv() (Chunk, error)
	Response() Response
	Close() error
}

// Provider is one model endpoint with one credential.
type Provider interface {
	// Stream sends req and returns its reply stream. Errors that come from
	// the provider (HTTP status, connection failure) should be *Error.
	Stream(ctx context.Context, req Request) (Stream, error)
}

// Resumable is a Provider that keeps state per conversation — the script
// model keeps each conversation's place in its script. An engine that runs
// a turn's model steps in different processes (package temporal) carries
// that state with the turn: Suspend before a step ends, Resume before the
// next begins, so that the turn goes on where it was.
type Resumable interface {
	Provider
	// Suspend returns the conversation's state.
	Suspend(conversation string) json.RawMessage
	// Resume sets the conversation's state to one Suspend returned; state
	// it cannot read is ignored.
	Resume(conversation string, state json.RawMessage)
}

// Endpoint is one link of a failover chain: a provider with one credential
// and the model to ask for.
type Endpoint struct {
	// Provider makes the calls: script.New, or the openai and anthropic
	// packages' providers. It must not be nil.
	Provider Provider
	// ProviderName is "openai", "anthropic" or "script".
	ProviderName string
	// Model is the model to ask for ("gpt-4o-mini"); for the script
	// provider, only a name for records.
	Model string
	// Profile names the credential for records: the environment variable
	// it came from, or "#2"; never the key itself.
	Profile string
}

// Name returns "provider:model", as the agent file writes it.
func (e Endpoint) Name() string { return e.ProviderName + ":" + e.Model }

// Error is a provider failure.
type Error struct {
	// Provider is the provider that failed: openai, anthropic or script.
	Provider string
	// Status is the HTTP status, or 0 for a connection failure or a
	// malformed stream.
	Status int
	// Message is the provider's own reason.
	Message string
	// RetryAfter is the provider's Retry-After, if it sent one.
	RetryAfter time.Duration
	// Malformed is set when the stream could not be parsed.
	Malformed bool
	// TooLong is set when the provider refused the request because it is
	// longer than the model accepts (its context window, or the request
	// size): a shorter history may be accepted where a retry would not.
	TooLong bool
	// Err is the underlying error, when there is one (the SDK's).
	Err error
}

// Error returns the provider, the HTTP status when there is one, and the
// provider's reason: "openai: HTTP 429: Rate limit reached".
func (e *Error) Error() string {
	switch {
	case e.Status != 0:
		return fmt.Sprintf("%s: HTTP %d: %s", e.Provider, e.Status, e.Message)
	case e.Malformed:
		return fmt.Sprintf("%s: malformed stream: %s", e.Provider, e.Message)
	}
	return fmt.Sprintf("%s: %s", e.Provider, e.Message)
}

// Unwrap returns Err.
func (e *Error) Unwrap() error { return e.Err }

// EmptyReplyError is a reply that ended normally with nothing in it: no
// text and no tool call. Its phase is llm_empty, an LLM phase: the same
// model asked again, or the next one of the chain, may well answer.
type EmptyReplyError struct {
	// Provider is the provider that sent the reply.
	Provider string
	// FinishReason is why the provider said the reply ended ("stop",
	// "length", "end_turn", "max_tokens"), if it said.
	FinishReason string
}

// Error says whose reply was empty, with its finish reason when known.
func (e *EmptyReplyError) Error() string {
	s := e.Provider + ": empty reply: no text and no tool call"
	if e.FinishReason != "" {
		s += " (finish reason " + e.FinishReason + ")"
	}
	return s
}

// OutOfTokens reports whether the provider ended the reply at its output
// token limit (model.max_tokens): a model that spent it all before writing
// anything, as a reasoning model can.
func (e *EmptyReplyError) OutOfTokens() bool {
	return e.FinishReason == "length" || e.FinishReason == "max_tokens"
}

// Rejected reports whether the provider refused the request itself (400,
// 401, 403, 404, 413, 422): retrying with another model will not help,
// and the turn fails with model_rejected — after the model's other
// credentials, when the refusal was of the credential (CredentialRefused).
func (e *Error) Rejected() bool {
	switch e.Status {
	case 400, 401, 403, 404, 413, 422:
		return true
	}
	return false
}

// CredentialRefused reports whether the refusal may be the credential's
// own (401: a key revoked, expired or mistyped; 403: a key without access
// to the model), so that the same model's next credential may be
// accepted: what a list of credentials is for (spec §6, "auth profiles").
func (e *Error) CredentialRefused() bool {
	return e.Status == 401 || e.Status == 403
}

// Phase classifies a model call failure. Timeouts keep their own phase;
// every other provider failure is llm_http; a cancellation of the turn is
// the cancel (or turn-level) phase of its cause.
func Phase(err error) budget.Phase {
	if te, ok := budget.AsTimeout(err); ok {
		return te.Phase
	}
	if _, ok := budget.AsCancel(err); ok {
		return budget.PhaseCancel
	}
	if _, ok := budget.AsReplyTooLong(err); ok {
		return budget.PhaseLLMReplyCap
	}
	var ee *EmptyReplyError
	if errors.As(err, &ee) {
		return budget.PhaseLLMEmpty
	}
	return budget.PhaseLLMHTTP
}
