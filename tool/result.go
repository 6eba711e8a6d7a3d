package tool

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
)

// ErrorInfo is the body of a tool result that is not the tool's output: a
// timeout, a tool error, a call that could not be made. The model receives
// it as {"error": ErrorInfo}.
type ErrorInfo struct {
	// Type is tool_timeout, tool_error, tool_cancelled, tool_denied or
	// approval_expired.
	Type string `json:"type"`
	// Tool is the tool's name.
	Tool string `json:"tool"`
	// Reason refines a tool_error made before the tool ran: unknown_tool,
	// invalid_json, invalid_arguments, limit.
	Reason string `json:"reason,omitempty"`
	// Phase, Limit, Elapsed, Source and Knob say which budget stopped the
	// call (tool_timeout, approval_expired): its phase, its value and the
	// time elapsed in Go duration syntax ("30s", "30.002s"), where the
	// value came from, and what changes it. A tool_cancelled has Phase and
	// Elapsed alone; other types have none of them (omitted).
	Phase   string `json:"phase,omitempty"`
	Limit   string `json:"limit,omitempty"`
	Elapsed string `json:"elapsed,omitempty"`
	Source  string `json:"source,omitempty"`
	Knob    string `json:"knob,omitempty"`
	// ExitCode is a failed exec tool's exit status; nil (omitted) when it
	// has none.
	ExitCode *int `json:"exit_code,omitempty"`
	// Message is the sentence for the model: what happened, and what to
	// try instead.
	Message string `json:"message"`
	// StderrTail (stderr_tail) is the end of a failed tool's stderr; empty
	// (omitted) when there is none.
	StderrTail string `json:"stderr_tail,omitempty"`
	// PartialOutput (partial_output) is what the tool wrote before it
	// failed or was stopped; empty (omitted) when nothing.
	PartialOutput string `json:"partial_output,omitempty"`
	// PartialTruncated says that PartialOutput is the end of a longer
	// output: what the tool wrote before it is not in the result.
	PartialTruncated bool `json:"partial_output_truncated,omitempty"`
	// LastProgress is the last progress report of a stopped call ("3 of
	// 10: fetching page 3"): how far it got, when its output does not say
	// (an MCP call has none).
	LastProgress string `json:"last_progress,omitempty"`
	// Field is the JSON pointer of the argument that failed the schema
	// ("/url"), for Reason invalid_arguments; empty (omitted) otherwise.
	Field string `json:"field,omitempty"`
	// Overran is set, with time notes on, on the error of an advisory
	// call that ran past its budget.
	Overran bool `json:"overran,omitempty"`
}

// String returns the JSON the model receives: what json.Marshal makes of
// {"error": e}, byte for byte, written by hand — a burst of stops writes
// thousands of these at once, and reflection was most of their cost.
func (e ErrorInfo) String() string {
	n := len(`{"error":{"type":"","tool":"","message":""}}`) + len(e.Type) + len(e.Tool) + len(e.Message) +
		len(e.Reason) + len(e.Phase) + len(e.Limit) + len(e.Elapsed) + len(e.Source) + len(e.Knob) +
		len(e.StderrTail) + len(e.PartialOutput) + len(e.Field) + len(e.LastProgress) + 190
	b := make([]byte, 0, n)
	b = append(b, `{"error":{"type":`...)
	b = appendJSONString(b, e.Type)
	b = append(b, `,"tool":`...)
	b = appendJSONString(b, e.Tool)
	field := func(name, v string) {
		if v != "" {
			b = append(b, ',', '"')
			b = append(b, name...)
			b = append(b, '"', ':')
			b = appendJSONString(b, v)
		}
	}
	field("reason", e.Reason)
	field("phase", e.Phase)
	field("limit", e.Limit)
	field("elapsed", e.Elapsed)
	field("source", e.Source)
	field("knob", e.Knob)
	if e.ExitCode != nil {
		b = append(b, `,"exit_code":`...)
		b = strconv.AppendInt(b, int64(*e.ExitCode), 10)
	}
	b = append(b, `,"message":`...)
	b = appendJSONString(b, e.Message)
	field("stderr_tail", e.StderrTail)
	field("partial_output", e.PartialOutput)
	if e.PartialTruncated {
		b = append(b, `,"partial_output_truncated":true`...)
	}
	field("last_progress", e.LastProgress)
	field("field", e.Field)
	if e.Overran {
		b = append(b, `,"overran":true`...)
	}
	b = append(b, '}', '}')
	return string(b)
}

// appendJSONString appends s as encoding/json writes a string: HTML
// characters, U+2028 and U+2029 escaped, invalid UTF-8 as U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		if c := s[i]; c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '\\', '"':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// PartialBytes is how much partial output a stopped or failed call's
// result carries: the end of what the tool wrote. The record keeps the
// start of it, up to max_tool_output.
const PartialBytes = 16 << 10

// partial returns the partial_output of a stopped or failed call whose
// tool returned r, and whether it is the end of a longer output.
func partial(r *Result) (string, bool) {
	if r == nil {
		return "", false
	}
	out := r.Output
	if len(r.OutputTail) > 0 {
		out = r.OutputTail
	}
	t := tail(string(out), PartialBytes)
	return validText(t), r.Truncated || len(t) < len(r.Output)
}

// ModelResult returns what the model is told about an execution of the
// named tool under budget b, and whether that is the tool's own output.
func ModelResult(name string, b budget.ToolBudget, x *Execution) string {
	switch x.Outcome {
	case event.OutcomeOK:
		out := validText(x.Result.outputString())
		if x.Result != nil && x.Result.Truncated {
			out += fmt.Sprintf("\n[output truncated: only the first %d bytes were kept]", len(x.Result.Output))
		}
		return out
	case event.OutcomeError:
		return errorInfo(name, x).String()
	case event.OutcomeTimedOut, event.OutcomeAbandoned:
		return timeoutInfo(name, b, x).String()
	default: // cancelled
		return cancelledInfo(name, x).String()
	}
}

// TimedResult is ModelResult with the call's time against its budget, for
// time notes (context.time_notes, docs/decisions/time-notes.md). The
// tool's own output stays as it was and is followed by one line,
// "[timebox: took 1.2s of 10s]" (of an advisory call past its budget,
// "[timebox: took 12s of 10s: overran its advisory budget]"), as a cut
// output is followed by "[output truncated: ...]". A result that is
// already an error object says it in its fields: elapsed and limit, and
// overran for an advisory call; a tool_timeout has them already.
func TimedResult(name string, b budget.ToolBudget, x *Execution) string {
	if b.Timeout.Off() {
		return ModelResult(name, b, x)
	}
	limit := budget.FormatDuration(b.Timeout.D)
	switch x.Outcome {
	case event.OutcomeOK:
		note := "[timebox: took " + noteDuration(x.Elapsed()) + " of " + limit
		if x.Overran {
			note += ": overran its advisory budget"
		}
		out := ModelResult(name, b, x)
		if out != "" && !strings.HasSuffix(out, "\n") {
			out += "\n"
		}
		return out + note + "]"
	case event.OutcomeError:
		info := errorInfo(name, x)
		info.Elapsed, info.Limit, info.Overran = noteDuration(x.Elapsed()), limit, x.Overran
		return info.String()
	case event.OutcomeTimedOut, event.OutcomeAbandoned:
		return ModelResult(name, b, x)
	default:
		info := cancelledInfo(name, x)
		info.Limit = limit
		return info.String()
	}
}

// noteDuration renders a call's time for the model: whole milliseconds
// under a second, tenths of a second under a minute, whole seconds above,
// so that the note stays short.
func noteDuration(d time.Duration) string {
	switch {
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

func errorInfo(name string, x *Execution) ErrorInfo {
	info := ErrorInfo{Type: "tool_error", Tool: name, Message: validText(x.Err.Error())}
	var te *Error
	if errors.As(x.Err, &te) {
		info.ExitCode = te.ExitCode
		info.StderrTail = validText(te.StderrTail)
		info.Message = validText(te.Message)
	}
	if x.Result != nil {
		if info.StderrTail == "" {
			info.StderrTail = validText(x.Result.StderrTail)
		}
		if info.ExitCode == nil {
			info.ExitCode = x.Result.ExitCode
		}
		info.PartialOutput, info.PartialTruncated = partial(x.Result)
	}
	info.Message = fmt.Sprintf("Tool %q failed: %s", name, strings.TrimSpace(info.Message))
	return info
}

func cancelledInfo(name string, x *Execution) ErrorInfo {
	elapsed := budget.Round(x.Elapsed()).String()
	info := ErrorInfo{Type: "tool_cancelled", Tool: name, Phase: string(x.Phase), Elapsed: elapsed,
		Message: "Tool " + strconv.Quote(name) + " was stopped after " + elapsed +
			" because the turn was stopped (" + causeText(x.Cause) + ")." + restartedText(x)}
	if x.Result != nil {
		info.PartialOutput, info.PartialTruncated = partial(x.Result)
	}
	info.LastProgress = progressText(x.LastReport)
	return info
}

func timeoutInfo(name string, b budget.ToolBudget, x *Execution) ErrorInfo {
	te, ok := budget.AsTimeout(x.Cause)
	if !ok { // abandoned after a turn-level stop
		te = b.Timeout.Expired(x.Phase, "", 0)
	}
	elapsed := budget.Round(x.Elapsed())
	info := ErrorInfo{Type: "tool_timeout", Tool: name, Phase: string(te.Phase),
		Limit: te.Limit.String(), Elapsed: elapsed.String(), Source: string(te.Source), Knob: te.Knob}
	var what string
	if te.Phase == budget.PhaseToolIdle {
		what = "Tool " + strconv.Quote(name) + " reported no progress for " + te.Limit.String() +
			" (its idle limit) and was stopped after " + elapsed.String() + "."
	} else {
		what = "Tool " + strconv.Quote(name) + " did not finish within " + te.Limit.String() + " and was stopped."
	}
	switch {
	case x.Abandoned:
		if cut, ok := strings.CutSuffix(what, " and was stopped."); ok {
			what = cut + "."
		}
		what += " It was asked to stop and had not after " + budget.Round(b.KillGrace.D).String() + ", so timebox stopped waiting for it."
	case x.Result != nil && x.Result.StopUnconfirmed && !x.Result.ServerRestarted:
		what = strings.Replace(what, " and was stopped", ", and was asked to stop", 1) +
			" Its work may still go on: check before asking for it again."
	}
	// Plain concatenation, here and above: a burst of deadlines builds
	// thousands of these at once.
	info.Message = what + " It may be hung (for example on an unreachable service). Try a narrower request or a different tool; an operator can raise " + te.Knob + "." + restartedText(x)
	if x.Result != nil {
		info.PartialOutput, info.PartialTruncated = partial(x.Result)
	}
	info.LastProgress = progressText(x.LastReport)
	return info
}

// restartedText says that the call's server was restarted because it went
// on with the call after its cancellation; "" otherwise.
func restartedText(x *Execution) string {
	if x.Result == nil || !x.Result.ServerRestarted {
		return ""
	}
	return " Its server went on with the call after it was cancelled, so timebox restarted the server."
}

func causeText(cause error) string {
	if cause == nil {
		return "cancelled"
	}
	if te, ok := budget.AsTimeout(cause); ok {
		return string(te.Phase) + " limit of " + te.Limit.String() + ", " + te.Knob
	}
	if ce, ok := budget.AsCancel(cause); ok {
		// In words, not "client_gone by the client".
		switch ce.Reason {
		case budget.ClientGone:
			if ce.By == "" || ce.By == "the client" {
				return "its client went away"
			}
			return budget.WentAway(ce.By)
		case budget.Shutdown:
			return "the server is shutting down"
		}
	}
	return cause.Error()
}

func (r *Result) outputString() string {
	if r == nil {
		return ""
	}
	return string(r.Output)
}

// validText replaces bytes that are not UTF-8 so that every result can be
// sent to a model API and stored as text.
func validText(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }

// Refusal returns the tool_error result for a call that was not run:
// an unknown tool, arguments that are not JSON or fail the schema, a limit.
func Refusal(name, reason, field, message string) string {
	return ErrorInfo{Type: "tool_error", Tool: name, Reason: reason, Field: field, Message: message}.String()
}

// Denied returns the tool_denied result of a call a person denied: it was
// not run. by says who, reason why, when they said. A call timebox itself
// denied (by "timebox …": no one could be asked, the request could not be
// made) is not said to be a person's decision.
func Denied(name, by, reason string) string {
	msg := "A person denied this call"
	if by == "timebox" || strings.HasPrefix(by, "timebox ") {
		msg = "This call was denied without a person's decision"
	}
	if by != "" {
		msg += " (" + by + ")"
	}
	if reason != "" {
		msg += ": " + reason
	}
	msg += ". It was not run. Do not ask for it again as it is; go on without it, or ask the user what they want instead."
	return ErrorInfo{Type: "tool_denied", Tool: name, Message: msg}.String()
}

// ApprovalExpired returns the approval_expired result of a call that got
// no decision within its approval timeout d: it was not run.
func ApprovalExpired(name string, d budget.Duration, waited time.Duration) string {
	return ErrorInfo{Type: "approval_expired", Tool: name, Phase: string(budget.PhaseApproval), Limit: d.D.String(),
		Elapsed: budget.Round(waited).String(), Source: string(d.Source), Knob: d.Knob,
		Message: "Tool " + strconv.Quote(name) + " needs a person's approval and got no decision within " + budget.FormatDuration(d.D) +
			", so it was not run. Tell the user what you wanted to do and why; an operator can raise " + d.Knob + "."}.String()
}

// CallRecord is the record of call callID of tool name (of kind kind, with
// arguments args) that ran under b, as Run's x says, its result as the
// model (or an MCP client) was answered: one rule for a turn's calls and
// for those timebox mcp serve answers. The turn and step are the caller's
// to set.
func CallRecord(callID, name, kind string, args json.RawMessage, b budget.ToolBudget, x *Execution, result string) event.ToolCall {
	rec := event.ToolCall{CallID: callID, Tool: name, Kind: kind,
		Arguments: args, StartedAt: x.Started, EndedAt: x.Ended, DurationMS: x.Elapsed().Milliseconds(),
		TimeoutMS: b.Timeout.MS(), TimeoutSource: b.Timeout.Source, IdleTimeoutMS: b.IdleTimeout.MS(),
		Enforcement: b.Enforcement, Outcome: x.Outcome, Phase: x.Phase, Overran: x.Overran,
		Abandoned: x.Abandoned, ProgressCount: x.Progress, Result: result}
	if x.Result != nil {
		rec.ExitCode, rec.StderrTail, rec.Truncated = x.Result.ExitCode, strings.ToValidUTF8(x.Result.StderrTail, "\uFFFD"), x.Result.Truncated
		rec.ServerRestarted = x.Result.ServerRestarted
	}
	var te *Error
	if errors.As(x.Err, &te) {
		if rec.ExitCode == nil {
			rec.ExitCode = te.ExitCode
		}
		if rec.StderrTail == "" {
			rec.StderrTail = te.StderrTail
		}
		if rec.StderrTail == "" {
			rec.StderrTail = te.Stack
		}
	}
	return rec
}

// progressText says a progress report in words: "3 of 10: fetching",
// "40: fetching", "fetching"; "" for none.
func progressText(r *Report) string {
	if r == nil {
		return ""
	}
	var s string
	switch {
	case r.Progress != nil && r.Total != nil:
		s = strconv.FormatFloat(*r.Progress, 'g', -1, 64) + " of " + strconv.FormatFloat(*r.Total, 'g', -1, 64)
	case r.Progress != nil:
		s = strconv.FormatFloat(*r.Progress, 'g', -1, 64)
	}
	if m := strings.TrimSpace(r.Message); m != "" {
		if s != "" {
			s += ": "
		}
		s += validText(m)
	}
	return s
}
