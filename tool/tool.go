// Package tool defines what a tool is to timebox and runs one tool call
// under its budget (spec §3, §4): the deadline and idle window, the polite
// and the forced stop, abandonment of a cooperative call that will not stop,
// the advisory overrun measurement, progress, and the result the model is
// given.
//
// Tool kinds live in their own packages (tool/exectool, tool/mcptool); Go
// functions become tools through Func. The package knows nothing of turns.
package tool

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"time"

	"github.com/timebox-run/timebox/budget"
)

// Kind is the kind of a tool, as records carry it.
type Kind string

// The tool kinds of spec §9.
const (
	KindExec Kind = "exec"
	KindGo   Kind = "go"
	KindMCP  Kind = "mcp"
)

// DefaultEnforcement returns the enforcement a tool of kind k gets when its
// entry does not name one: hard for subprocess and MCP tools, cooperative
// for Go functions (spec §3).
func DefaultEnforcement(k Kind) budget.Enforcement {
	if k == KindGo {
		return budget.Cooperative
	}
	return budget.Hard
}

// Spec is what the model is told about a tool.
type Spec struct {
	// Name is the name the model calls the tool by; it matches NameRE.
	Name string `json:"name"`
	// Description tells the model what the tool does.
	Description string `json:"description"`
	// InputSchema is a JSON Schema object; empty means any object.
	InputSchema json.RawMessage `json:"input_schema,omitempty"`
}

// Checker is a Tool that can tell, before any call, that none can run
// (a Func without a function). agent.New refuses a tool whose Check
// returns an error, with that error.
type Checker interface {
	Check() error
}

// Tool is one tool. Implementations must be safe for concurrent calls.
type Tool interface {
	// Spec returns what the model is told about the tool.
	Spec() Spec
	// Kind returns the tool's kind (exec, go or mcp), which decides its
	// default enforcement.
	Kind() Kind
	// Call runs one call. It must return promptly once ctx is done: a
	// subprocess tool stops its process tree (SIGTERM, then SIGKILL after
	// c.KillGrace or budget.GraceFor), an MCP tool sends its cancellation,
	// a Go function returns. It returns whatever output it has, even with
	// an error, so that partial output reaches the model. When it stopped
	// because ctx was done it returns an error (context.Cause(ctx) will
	// do). A tool that fails returns an error describing the failure,
	// wrapped in *Error when it has an exit code or stderr to report.
	Call(ctx context.Context, c *Call) (*Result, error)
}

// ProcessOwner is implemented by tools whose Call, once its context is
// done, stops every process the call started and returns only when they
// are gone, within a bound of its own (tool/exectool: the kill grace, then
// SIGKILL and at most a few seconds for the kernel to finish the
// processes). Run never abandons a call of such a tool: it
// waits for the call to return, so that the call ends timed_out or
// cancelled with nothing it started left running, and no goroutine of it
// outlives the call.
type ProcessOwner interface {
	Tool
	OwnsProcesses()
}

// Call is one call of a tool, as the tool sees it.
type Call struct {
	// ID names the call, unique in its turn (the record's call_id).
	ID string
	// TurnID names the turn; empty for a call made outside a turn (an MCP
	// client's, through mcpserve).
	TurnID string
	// Tool is the name the tool was called by.
	Tool string
	// Input is the call's arguments (JSON); a turn and mcpserve check them
	// against the tool's input schema before the call.
	Input json.RawMessage
	// Deadline is when the call's own timeout fires; Timeout is its length.
	// For an advisory call it is the deadline the call is measured against.
	Deadline time.Time
	Timeout  time.Duration
	// KillGrace is the time between the polite and the forced stop when the
	// call's own budget fires. A cancellation uses budget.GraceFor.
	KillGrace time.Duration
	// MaxOutput is the number of output bytes kept; the rest is discarded.
	MaxOutput int64
	// Progress receives the call's progress reports.
	Progress Progress
	// TraceParent is the W3C traceparent of the call's span when the turn
	// is traced: exec tools get it as TRACEPARENT in their environment, MCP
	// servers in the call's _meta, so that what they trace joins the turn.
	TraceParent string
}

// Report is one progress report. Every field is optional; an empty
// Report still says the call is alive. Go's new(expr) makes the pointers:
// Report{Progress: new(3.0), Total: new(10.0), Message: "page 3"}.
type Report struct {
	// Progress is how far the call has come, in any unit; nil is unknown.
	Progress *float64 `json:"progress,omitempty"`
	// Total is what Progress counts up to; nil is unknown.
	Total *float64 `json:"total,omitempty"`
	// Message says what the call is doing, for the person watching.
	Message string `json:"message,omitempty"`
}

// Progress is how a running call reports that it is alive. Report is safe
// for concurrent use, never blocks for long, and keeps no reference to r:
// the caller may reuse what its pointers point to. A report made after the
// call ended is dropped quietly.
type Progress interface {
	Report(Report)
}

// Result is what a tool call produced.
type Result struct {
	// Output is the result: JSON or plain text, at most the call's
	// MaxOutput bytes.
	Output []byte
	// Truncated is true when output beyond MaxOutput was discarded.
	Truncated bool
	// OutputTail is, when Truncated, the end of everything the tool wrote
	// (up to PartialBytes), which Output, its start, does not hold: a
	// stopped or failed call's partial_output. nil when Output is all of
	// it, or the tool kept no tail.
	OutputTail []byte
	// ExitCode is a subprocess's exit status, nil for other kinds or when
	// the process was killed by a signal.
	ExitCode *int
	// StderrTail is the end of a subprocess's log (stderr, without its
	// progress lines).
	StderrTail string
	// ServerRestarted is set on what a stopped MCP call returns when its
	// server had not answered the call's cancellation within the kill
	// grace and was restarted for it (mcp.on_ignored_cancel: restart);
	// StderrTail then says so.
	ServerRestarted bool
	// StopUnconfirmed is set on what a stopped call returns when the stop
	// was asked of something that may not have obeyed: an MCP server sent
	// the call's cancellation and not waited for (mcp.on_ignored_cancel:
	// keep). The model is told its work may still go on.
	StopUnconfirmed bool
}

// Error is a tool's own failure: a non-zero exit, an MCP error result, a Go
// function's error. The model is told it as a tool_error.
type Error struct {
	// Message says what failed.
	Message string
	// ExitCode is a subprocess's exit status; nil when it has none.
	ExitCode *int
	// StderrTail is the end of a subprocess's stderr, without ::progress::
	// lines; empty when there is none.
	StderrTail string
	// Stack is where a Go tool panicked, for the call's record
	// (stderr_tail) and its operator; the model is not given it.
	Stack string
}

// Error returns Message, after the exit status when there is one.
func (e *Error) Error() string {
	if e.ExitCode != nil {
		return fmt.Sprintf("exit status %d: %s", *e.ExitCode, e.Message)
	}
	return e.Message
}

// NameRE is the rule for a tool's name: what model APIs accept as a
// function name, 1 to 64 letters, digits, _ and -. The agent file's
// schema, the loader and agent.New all check it.
var NameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)
