package tool

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
)

// ReapMargin is how long, past the kill grace, the runner waits for a
// hard-enforced call of a tool that is not a ProcessOwner (an MCP call,
// whose server is told to cancel) before it treats the call as abandoned.
// A ProcessOwner's hard calls are never abandoned: they are waited for.
const ReapMargin = time.Second

var abandonedRunning atomic.Int64

// AbandonedRunning returns the number of abandoned calls whose code is still
// running: cooperative calls that did not return within the kill grace after
// their context was cancelled. Each is counted until it returns.
func AbandonedRunning() int64 { return abandonedRunning.Load() }

var serverRestarts atomic.Int64

// ServerRestarts returns the number of tool servers this process
// restarted because they had not answered a cancelled call within its kill
// grace (mcp.on_ignored_cancel: restart), for the metric
// timebox_mcp_ignored_cancel_restarts_total.
func ServerRestarts() int64 { return serverRestarts.Load() }

// CountServerRestart counts one such restart (package mcptool calls it).
func CountServerRestart() { serverRestarts.Add(1) }

// Execution is how one call went.
type Execution struct {
	// Result is what the tool returned, possibly partial; nil when the call
	// was abandoned.
	Result *Result
	// Err is the tool's own error when Outcome is error.
	Err error
	// Cause is the budget or cancellation that stopped the call, when one
	// did: a *budget.TimeoutError or *budget.CancelError.
	Cause error
	// Outcome is how the call ended, as its record says.
	Outcome event.Outcome
	// Phase is the phase of the budget or cancellation that ended the
	// call; empty when it ended by itself.
	Phase budget.Phase
	// Started and Ended are when the call started and ended (or was
	// abandoned).
	Started time.Time
	Ended   time.Time
	// Deadline is when the call's own timeout fired or would have; zero
	// when it had none.
	Deadline time.Time
	// Overran is set for an advisory call that ran past its timeout.
	Overran bool
	// Abandoned is set for a call that did not return within the kill
	// grace after it was stopped: Run returned without it.
	Abandoned bool
	// Progress is the number of progress reports the call made.
	Progress int
	// LastReport is the last progress report the call made, nil when it
	// made none: a stopped call tells the model how far it got with it.
	LastReport *Report
}

// Elapsed returns the call's wall-clock duration.
func (x *Execution) Elapsed() time.Duration { return x.Ended.Sub(x.Started) }

// Hooks are called by Run as the call goes. Each may be nil.
type Hooks struct {
	// OnAlive is called for every progress report the call makes, before
	// any coalescing, on the goroutine that reports (for a subprocess, the
	// one reading its stderr). It must be quick and must never block: the
	// turn's step watchdog only notes the time there (spec §4).
	OnAlive func()
	// OnProgress is called with the call's progress reports, coalesced:
	// the first, then at most one every ProgressInterval, or one for each
	// new whole percent of the report's total, and always the call's last
	// report. It is called on a goroutine of its own, one report at a time
	// and in order, so it may be slow (it stores and publishes an event)
	// without ever holding the tool up; every call of it has returned
	// before Run returns.
	OnProgress func(Report)
	// OnLate is called when an abandoned call finally returns, with what it
	// returned. It runs on the call's own goroutine.
	OnLate func(res *Result, err error, ended time.Time)
}

type returned struct {
	res   *Result
	err   error
	ended time.Time
}

// Run runs one call of t under budget b and reports how it went. It returns
// when the call has returned, or when the call was abandoned: a call whose
// context was cancelled (by its own budget or by ctx) and that did not
// return within the grace that budget.GraceFor allows (plus ReapMargin for
// hard enforcement). A call of a ProcessOwner (an exec tool) is never
// abandoned, whatever its enforcement: Run waits until it returns, which
// the tool bounds. An
// abandoned call is counted by AbandonedRunning until it returns. Run
// never returns an error; Execution says everything.
//
// Run leaves in alone: the tool gets a copy with Progress, Deadline,
// Timeout and (when in has none) KillGrace filled from b, and the Execution
// says what was decided (Deadline). With advisory enforcement the call's
// own budget never interrupts it; ctx still does.
func Run(ctx context.Context, t Tool, in *Call, b budget.ToolBudget, h Hooks) *Execution {
	start := time.Now()
	c := new(Call)
	*c = *in
	name := c.Tool
	subject := fmt.Sprintf("tool %q", name)
	c.Timeout = b.Timeout.D
	if b.Timeout.D > 0 {
		c.Deadline = start.Add(b.Timeout.D)
	}
	if c.KillGrace == 0 {
		c.KillGrace = b.KillGrace.D
	}
	callCtx, cancel := context.WithCancelCause(ctx)

	p := newProgress(start, h)
	// Once the call is over, on the caller's goroutine: a Hooks.OnProgress
	// that panicked while its reports were passed on, on a goroutine of
	// their own, panics here, where the caller can recover it.
	defer p.rethrow()
	c.Progress = p
	var idle *idleWindow
	enforced := b.Enforcement != budget.Advisory
	if enforced && b.IdleTimeout.D > 0 {
		idle = p.idleWindow(b.IdleTimeout.D, func() {
			cancel(b.IdleTimeout.Expired(budget.PhaseToolIdle, subject, 0))
		})
	}
	var deadline *time.Timer
	if enforced && b.Timeout.D > 0 {
		deadline = time.AfterFunc(b.Timeout.D, func() {
			cancel(b.Timeout.Expired(budget.PhaseTool, subject, 0))
		})
	}
	done := make(chan returned, 1)
	go func() {
		res, err := invoke(callCtx, t, c)
		done <- returned{res, err, time.Now()}
	}()

	x := &Execution{Started: start, Deadline: c.Deadline}
	var r returned
	stopped := false
	select {
	case r = <-done:
	case <-ctx.Done():
		// The turn was stopped. Its cancellation closes ctx's channel
		// before callCtx's, so the tool, woken by callCtx's, is readied
		// after this goroutine, and Go's scheduler runs the goroutine
		// readied last first: a cooperative tool has then usually
		// returned by the time this one looks (below), and the call ends
		// without a grace timer or a second wait. Waiting on callCtx's
		// alone, this goroutine ran first, in 98 of 100 calls of
		// BenchmarkTurnWindDown.
		stopped = true
		<-callCtx.Done() // ctx's cancellation reaches callCtx at once
	case <-callCtx.Done():
		stopped = true
	}
	if stopped {
		if _, owns := t.(ProcessOwner); owns {
			// The tool stops its processes and returns, within its own
			// bound (see ProcessOwner), whatever its enforcement:
			// abandoning it here would only let them outlive the call, or
			// call abandoned what was in fact stopped.
			r = <-done
		} else {
			r, x.Abandoned = awaitGrace(callCtx, done, c.KillGrace, b.Enforcement)
		}
	}
	if deadline != nil {
		deadline.Stop()
	}
	if idle != nil {
		idle.stop()
	}
	x.Progress = p.end()
	x.LastReport = p.lastReport()

	if x.Abandoned {
		x.Ended = time.Now()
		x.Cause = withElapsed(budget.Cause(callCtx), x.Elapsed())
		x.Outcome = event.OutcomeAbandoned
		x.Phase = phaseOf(x.Cause)
		abandonedRunning.Add(1)
		go func() {
			r := <-done
			abandonedRunning.Add(-1)
			if h.OnLate != nil {
				h.OnLate(capOutput(r.res, c.MaxOutput), r.err, r.ended)
			}
		}()
		cancel(nil)
		return x
	}
	cancel(nil)

	x.Ended = r.ended
	x.Result = capOutput(r.res, c.MaxOutput)
	switch {
	case r.err == nil:
		// A completed result is used even when a budget fired at the same
		// instant: the work is done and was paid for.
		x.Outcome = event.OutcomeOK
	case callCtx.Err() != nil && !isOwnError(r.err):
		x.Cause = withElapsed(budget.Cause(callCtx), x.Elapsed())
		x.Phase = phaseOf(x.Cause)
		if x.Phase == budget.PhaseTool || x.Phase == budget.PhaseToolIdle {
			x.Outcome = event.OutcomeTimedOut
		} else {
			x.Outcome = event.OutcomeCancelled
		}
	default:
		x.Outcome = event.OutcomeError
		x.Err = r.err
	}
	if !enforced && b.Timeout.D > 0 && x.Elapsed() > b.Timeout.D {
		x.Overran = true
	}
	return x
}

// awaitGrace waits for a cooperative call stopped by callCtx to return,
// for as long as budget.GraceFor allows (plus ReapMargin for hard
// enforcement), and reports whether it gave up (abandoned).
func awaitGrace(callCtx context.Context, done <-chan returned, killGrace time.Duration, e budget.Enforcement) (r returned, abandoned bool) {
	select {
	case r = <-done:
		// It has returned already, as a cooperative tool often has: no
		// timer to arm (thousands of turns stopped at one instant arm and
		// stop thousands).
		return r, false
	default:
	}
	grace := budget.GraceFor(context.Cause(callCtx), killGrace)
	if e == budget.Hard {
		grace += ReapMargin
	}
	wait := time.NewTimer(grace)
	defer wait.Stop()
	select {
	case r = <-done:
		return r, false
	case <-wait.C:
		return returned{}, true
	}
}

// isOwnError reports whether err is a tool's own failure rather than its
// report of having been stopped.
func isOwnError(err error) bool {
	// A walk down a plain chain first: errors.As reflects and allocates
	// its target, in every call of thousands stopped at one instant.
	for e := err; e != nil; {
		switch x := e.(type) {
		case *Error:
			return true
		case interface{ As(any) bool }, interface{ Unwrap() []error }:
			var te *Error
			return errors.As(e, &te)
		case interface{ Unwrap() error }:
			e = x.Unwrap()
		default:
			return false
		}
	}
	return false
}

// withElapsed returns cause with its elapsed time filled in. The cause is
// shared (it is the context's cause, read by whoever holds the context), so
// a copy is filled, never the original.
func withElapsed(cause error, d time.Duration) error {
	if te, ok := cause.(*budget.TimeoutError); ok && te.Elapsed == 0 {
		cp := *te
		cp.Elapsed = d
		return &cp
	}
	return cause
}

// phaseOf returns the phase of a stop cause.
func phaseOf(cause error) budget.Phase {
	if te, ok := budget.AsTimeout(cause); ok {
		return te.Phase
	}
	return budget.PhaseCancel
}

// invoke calls t, turning a panic into a tool error so that one broken tool
// cannot take the runtime down.
func invoke(ctx context.Context, t Tool, c *Call) (res *Result, err error) {
	defer func() {
		if v := recover(); v != nil {
			// The model is told that it panicked, and why; the stack,
			// with this machine's paths, is for the record only.
			res, err = nil, &Error{Message: fmt.Sprintf("tool panicked: %v", v), Stack: tail(string(debug.Stack()), 2048)}
		}
	}()
	return t.Call(ctx, c)
}

// capOutput cuts r's output to max bytes at a UTF-8 boundary.
func capOutput(r *Result, max int64) *Result {
	if r == nil || max <= 0 || int64(len(r.Output)) <= max {
		return r
	}
	cp := *r
	cp.Output = r.Output[:CutAt(r.Output, int(max))]
	cp.Truncated = true
	return &cp
}

// CutAt returns where to cut b to keep at most max bytes without splitting
// a UTF-8 sequence: max, or the start of the sequence max falls inside.
// b must hold the bytes after max that the sequence has (utf8.UTFMax-1
// more are enough); bytes that are not UTF-8 are cut at max.
func CutAt(b []byte, max int) int {
	if max >= len(b) {
		return len(b)
	}
	cut := max
	for cut > 0 && cut > max-(utf8.UTFMax-1) && !utf8.RuneStart(b[cut]) {
		cut--
	}
	if r, size := utf8.DecodeRune(b[cut:]); r == utf8.RuneError && size <= 1 || cut+size <= max {
		return max // not a sequence that max splits
	}
	return cut
}

// tail returns the last n bytes of s, starting at a rune boundary.
func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[len(s)-n:]
	for len(s) > 0 && !utf8.RuneStart(s[0]) {
		s = s[1:]
	}
	return s
}
