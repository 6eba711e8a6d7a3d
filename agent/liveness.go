package agent

import (
	"cmp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/machine"
)

// modelSubject, compactionSubject and toolSubject name an activity in a
// turn's messages and notices: "model gpt-4o", "compaction (model
// gpt-4o)", "tool crawl".
func modelSubject(model string) string      { return "model " + model }
func compactionSubject(model string) string { return "compaction (model " + model + ")" }
func toolSubject(tool string) string        { return "tool " + tool }

// activity is one running thing of a turn: a model call or a tool call.
type activity struct {
	step    int
	subject string // "tool crawl", "model gpt-4o"
	callID  string
	tool    string // tool name, for tool calls
	started time.Time
	// deadline is the tool's own deadline; while it is in the future the
	// tool counts as alive for the step watchdog (spec §2). Zero for model
	// calls, which have their own watchdogs.
	deadline time.Time
	limit    time.Duration
	// advisory marks an advisory tool call: it keeps the turn alive until
	// it returns, whatever its own deadline (spec §6), so the step
	// watchdog waits for it.
	advisory bool
	// streaming is set once a model call has received a chunk.
	streaming bool
	// compaction marks a history-compaction call.
	compaction bool
	// approvalOf, for a call waiting for a person's decision, names its
	// tool: the step watchdog does not fire while one waits (a person's
	// time is not the turn's), and notices do not name it.
	approvalOf string
	// lastReport is when the call last reported progress (a tool's
	// report, a model's stream chunk), as time since the watchdog's base
	// plus one; zero when it has not. Stored without the lock: a flooding
	// tool reports from the goroutine reading its output.
	lastReport atomic.Int64
}

// liveness is the turn's step watchdog and still_working notifier. It fires
// stop when nothing has progressed for the step budget and no running tool
// is still inside its own timeout. Its notices keep the turn's own beat:
// the first progress_notice after something started running when nothing
// was, then every interval while anything runs; each beat emits at most
// one still_working, naming every running call that has been silent for
// the interval (silentFor), and none when no call has
// (docs/decisions/quieter-notices.md).
//
// It costs a parked turn no goroutine and no channel: one timer, armed for
// the earliest thing due (docs/decisions/liveness.md). What can only move
// a due time later — progress, a tool's report — stores a time and leaves
// the timer alone: when it fires it finds the later time and waits again.
// What can move one earlier — a call starting, a call ending — re-arms it
// only when the new due time is before the one it is set for.
type liveness struct {
	step   budget.Duration
	notice time.Duration
	emit   func(event.Payload)
	stop   func(*budget.TimeoutError)

	// base and lastAlive: the time of the last tool progress report, as
	// time since base (it keeps the monotonic clock), stored without the
	// lock (alive).
	base      time.Time
	lastAlive atomic.Int64

	mu           sync.Mutex
	lastProgress time.Time
	running      []*activity // in the order they started
	// shared: running's array is a stop's snapshot too (freeze), which
	// must not change: the next begin or end makes running a new one.
	shared    bool
	last      *activity // the most recently started activity
	lastEnded time.Time
	fired     bool
	// noticeAt is the next beat of the notices; zero while nothing runs or
	// notices are off.
	noticeAt time.Time

	// timer runs check at due; nil until something is first due. due is
	// zero while the timer is not set (or is running check).
	timer  *time.Timer
	due    time.Time
	closed bool
	// checking counts the checks under way; close waits for them, so
	// that nothing is emitted after it returns.
	checking sync.WaitGroup
}

// newLiveness returns the watchdog of a turn, or of one unit of a turn
// whose units run elsewhere: then lastProgress is the last progress signal
// the units before it saw, so that the step window runs on across units.
func newLiveness(step budget.Duration, notice time.Duration, lastProgress time.Time, emit func(event.Payload), stop func(*budget.TimeoutError)) *liveness {
	now := time.Now()
	if lastProgress.IsZero() || lastProgress.After(now) {
		lastProgress = now
	}
	l := &liveness{
		step: step, notice: notice, emit: emit, stop: stop,
		base: now, lastProgress: lastProgress,
	}
	l.mu.Lock()
	l.armLocked(now)
	l.mu.Unlock()
	return l
}

// progress records a progress signal of the model call a: a stream chunk.
// It only moves the step's due time later, so the timer is left alone.
func (l *liveness) progress(a *activity) {
	l.mu.Lock()
	l.lastProgress = time.Now()
	a.lastReport.Store(int64(l.lastProgress.Sub(l.base)) + 1)
	l.mu.Unlock()
}

// alive records a progress report of the tool call a. A flooding tool
// calls it for each of thousands of reports, on the goroutine reading its
// output, so it only stores the time: the watchdog's timer, when it fires,
// finds the later time and waits again (progress can only move its
// deadline later, and can only take a call out of a notice).
func (l *liveness) alive(a *activity) {
	d := int64(time.Since(l.base))
	l.lastAlive.Store(d)
	a.lastReport.Store(d + 1)
}

// syncAlive folds the last report's time into lastProgress. l.mu is held.
func (l *liveness) syncAlive() {
	if a := l.base.Add(time.Duration(l.lastAlive.Load())); a.After(l.lastProgress) {
		l.lastProgress = a
	}
}

func (l *liveness) begin(a *activity) {
	l.mu.Lock()
	a.started = time.Now()
	if l.notice > 0 && l.noticeAt.IsZero() {
		// The first thing to run since nothing did starts the beat.
		l.noticeAt = a.started.Add(l.notice)
	}
	if l.shared {
		// A new array: the snapshot keeps the old one as it was.
		l.running, l.shared = slices.Clip(l.running), false
	}
	l.running = append(l.running, a)
	l.last = a
	l.armLocked(a.started)
	l.mu.Unlock()
}

// end removes a. A call that completed is a progress signal; one that
// failed is not.
func (l *liveness) end(a *activity, completed bool) {
	l.mu.Lock()
	if l.shared {
		// A new array, without a: the snapshot keeps the old one as it
		// was. The last call of a stopped turn ending allocates nothing.
		var kept []*activity
		for _, x := range l.running {
			if x != a {
				kept = append(kept, x)
			}
		}
		l.running, l.shared = kept, false
	} else {
		l.running = slices.DeleteFunc(l.running, func(x *activity) bool { return x == a })
	}
	l.lastEnded = time.Now()
	if len(l.running) == 0 {
		l.noticeAt = time.Time{} // the next thing to run starts a new beat
	}
	if completed {
		l.lastProgress = l.lastEnded
	}
	l.armLocked(l.lastEnded)
	l.mu.Unlock()
}

// lastProgressed returns the time of the last progress signal.
func (l *liveness) lastProgressed() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.syncAlive()
	return l.lastProgress
}

func (l *liveness) streaming(a *activity) {
	l.mu.Lock()
	a.streaming = true
	l.mu.Unlock()
}

// armLocked sets the timer for the earliest thing due after now, unless it
// is already set for earlier. l.mu is held.
func (l *liveness) armLocked(now time.Time) {
	next, ok := l.nextLocked(now)
	if !ok || l.closed || (!l.due.IsZero() && !next.Before(l.due)) {
		return
	}
	l.due = next
	if l.timer == nil {
		l.timer = time.AfterFunc(next.Sub(now), l.fire)
	} else {
		l.timer.Reset(next.Sub(now))
	}
}

// fire is the timer's function: it runs check and sets the timer for what
// is due next.
func (l *liveness) fire() {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return
	}
	l.due = time.Time{}
	l.checking.Add(1)
	l.mu.Unlock()
	defer l.checking.Done()
	now := time.Now()
	l.check(now)
	l.mu.Lock()
	l.armLocked(now)
	l.mu.Unlock()
}

// close stops the watchdog and waits for a check under way: after it
// returns nothing is emitted and stop is not called.
func (l *liveness) close() {
	l.mu.Lock()
	l.closed = true
	if l.timer != nil {
		l.timer.Stop()
	}
	l.due = time.Time{}
	l.mu.Unlock()
	l.checking.Wait()
}

// nextLocked returns when something is next due: a still_working notice or
// the step watchdog. l.mu is held.
func (l *liveness) nextLocked(now time.Time) (next time.Time, ok bool) {
	consider := func(t time.Time) {
		if !ok || t.Before(next) {
			next, ok = t, true
		}
	}
	if !l.noticeAt.IsZero() {
		consider(l.noticeAt)
	}
	if due, watching := l.stepDueLocked(); watching {
		consider(due)
	}
	if ok && next.Before(now) {
		next = now
	}
	return next, ok
}

// stepDueLocked returns when the step watchdog fires if nothing
// progresses, and whether it is watching at all. l.mu is held.
func (l *liveness) stepDueLocked() (time.Time, bool) {
	if l.step.Off() || l.fired || l.advisoryRunningLocked() {
		return time.Time{}, false
	}
	l.syncAlive()
	due := l.lastProgress.Add(l.step.D)
	for _, a := range l.running {
		if a.deadline.After(due) {
			due = a.deadline
		}
	}
	return due, true
}

// check fires what is due at now: the still_working notices and the step
// watchdog.
func (l *liveness) check(now time.Time) {
	l.mu.Lock()
	var notice *event.StillWorking
	if !l.noticeAt.IsZero() && !now.Before(l.noticeAt) {
		notice = l.noticeLocked(now)
		for !now.Before(l.noticeAt) {
			l.noticeAt = l.noticeAt.Add(l.notice)
		}
	}
	var fire *budget.TimeoutError
	if due, watching := l.stepDueLocked(); watching && !now.Before(due) {
		l.fired = true
		fire = l.step.Expired(budget.PhaseStep, "the turn", now.Sub(l.lastProgress))
	}
	l.mu.Unlock()
	if notice != nil {
		l.emit(notice)
	}
	if fire != nil {
		l.stop(fire)
	}
}

// noticeLocked returns the still_working of a beat at now: one notice
// naming every silent running call, nil when none is. l.mu is held.
func (l *liveness) noticeLocked(now time.Time) *event.StillWorking {
	var named []*activity
	var calls []event.SilentCall
	for _, a := range l.running {
		silent, ok := l.silentFor(a, now)
		if !ok {
			continue
		}
		named = append(named, a)
		calls = append(calls, event.SilentCall{Subject: a.subject, CallID: a.callID, Tool: a.tool,
			ElapsedMS: now.Sub(a.started).Milliseconds(), LimitMS: a.limit.Milliseconds(), SilentMS: silent.Milliseconds()})
	}
	if len(calls) == 0 {
		return nil
	}
	// In the order the model asked for them (call_S_I), a model call
	// (no call id) first; running is in the order they happened to start.
	slices.SortStableFunc(calls, func(x, y event.SilentCall) int {
		return cmp.Or(cmp.Compare(len(x.CallID), len(y.CallID)), strings.Compare(x.CallID, y.CallID))
	})
	n := &event.StillWorking{Step: named[0].step, Calls: calls}
	if len(calls) == 1 {
		c := calls[0]
		n.Subject, n.CallID, n.ElapsedMS, n.LimitMS = c.Subject, c.CallID, c.ElapsedMS, c.LimitMS
		return n
	}
	tools := make([]string, 0, len(calls))
	subjects := make([]string, 0, len(calls))
	for _, c := range calls {
		n.ElapsedMS = max(n.ElapsedMS, c.ElapsedMS)
		if c.Tool != "" {
			tools = append(tools, c.Tool)
		}
		subjects = append(subjects, c.Subject)
	}
	if len(tools) == len(calls) {
		n.Subject = "tools " + strings.Join(tools, ", ")
	} else {
		n.Subject = strings.Join(subjects, ", ")
	}
	return n
}

// silentFor reports whether a beat at now names a, and how long a has
// been silent: since its last progress report, or since it started. A call
// that reported within the last interval is not named — its report said
// more than a notice would. One that started less than half an interval
// before the beat waits for the next: the calls of a batch, started
// within milliseconds of each other, share their first beat, and a call
// that just started is not yet news. So a silent call is first named
// between half an interval and an interval and a half after it started
// (exactly an interval when it started the beat), and a call that reported
// just before a beat is named at the next one if it stays silent. l.mu is
// held.
func (l *liveness) silentFor(a *activity, now time.Time) (time.Duration, bool) {
	if a.approvalOf != "" || now.Sub(a.started) < l.notice/2 {
		return 0, false
	}
	since := a.started
	if r := a.lastReport.Load(); r > 0 {
		at := l.base.Add(time.Duration(r - 1))
		if now.Sub(at) < l.notice {
			return 0, false
		}
		if at.After(since) {
			since = at
		}
	}
	return now.Sub(since), true
}

// advisoryRunningLocked reports whether an advisory tool call is running;
// while one is, the step watchdog does not fire. Its end is a progress
// signal (end with completed), which starts a fresh step window. l.mu is
// held.
func (l *liveness) advisoryRunningLocked() bool {
	for _, a := range l.running {
		if a.advisory || a.approvalOf != "" {
			return true
		}
	}
	return false
}

// stopSnap is what a turn was running when it was stopped: taken by
// freeze, on the goroutine that stops the turn, and put in words by
// describe, on the turn's own. The timer's goroutine that stops a turn
// starts with a small stack, and building the sentence there grew it (a
// new stack and a copy, in every turn of a burst of ceilings: 7% of the
// wind-down's CPU in BenchmarkTurnWindDown).
type stopSnap struct {
	at time.Time
	// running is the liveness's array at the stop, which no one changes
	// (liveness.shared).
	running []*activity
	// streaming is whether the first model call running had received a
	// chunk by the stop.
	streaming  bool
	compacting bool
	last       *activity
	lastEnded  time.Time
}

// freeze halts the step watchdog of a turn that is being stopped (it could
// stop nothing more, and re-arming it as the calls wind down would only
// cost timer work: thousands of turns stopped at one instant re-arm
// thousands) and returns what runs at now. It allocates nothing. The
// notices go on while calls run.
func (l *liveness) freeze(now time.Time) stopSnap {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := snapOf(now, l.running, l.last, l.lastEnded)
	l.shared = len(l.running) > 0
	l.fired = true
	return s
}

// snapOf returns the snapshot of a turn at now whose running activities,
// in the order they started, are running, and whose last started is last,
// the last to end ending at lastEnded: freeze's, and StopOf's for a turn
// its events tell.
func snapOf(now time.Time, running []*activity, last *activity, lastEnded time.Time) stopSnap {
	s := stopSnap{at: now, running: running, last: last, lastEnded: lastEnded}
	model := false
	for _, a := range running {
		s.compacting = s.compacting || a.compaction
		if !model && a.approvalOf == "" && a.tool == "" {
			model, s.streaming = true, a.streaming
		}
	}
	return s
}

// note puts s in words: what ran, the tools running, and whether a tool
// or a compaction ran, for the stop's message and flags (spec §6).
func (s stopSnap) note() *machine.StopNote {
	desc, tools := s.describe()
	return &machine.StopNote{Desc: desc, Tools: tools, DuringRun: len(tools) > 0, DuringCompact: s.compacting}
}

// describe says what the turn was doing at its stop, for messages: "tool
// crawl, running for 41s", "model gpt-4o, waiting for its reply"; and the
// tools that were running.
func (s stopSnap) describe() (desc string, tools []string) {
	// Plain concatenation, no fmt, and no slice but the tools it returns:
	// thousands of turns stopped at one instant describe their stops.
	now := s.at
	var firstTool, first, firstWait *activity // the first of each to start
	for _, a := range s.running {
		switch {
		case a.approvalOf != "":
			if firstWait == nil {
				firstWait = a
			}
		case a.tool != "":
			if firstTool == nil {
				firstTool = a
			}
			tools = append(tools, a.tool)
		case first == nil:
			first = a
		}
	}
	switch {
	case len(tools) == 1:
		a := firstTool
		return machine.RunningDesc(a.tool, now.Sub(a.started)), tools
	case len(tools) > 1:
		var b strings.Builder
		b.WriteString("tools ")
		for _, a := range s.running {
			if a.approvalOf != "" || a.tool == "" {
				continue
			}
			if b.Len() > len("tools ") {
				b.WriteString(", ")
			}
			b.WriteString(a.tool + " (" + budget.RoundHuman(now.Sub(a.started)).String() + ")")
		}
		b.WriteString(" running")
		return b.String(), tools
	case first != nil:
		if s.streaming {
			return first.subject + ", streaming its reply (" + budget.RoundHuman(now.Sub(first.started)).String() + ")", nil
		}
		return first.subject + ", waiting for its reply (" + budget.RoundHuman(now.Sub(first.started)).String() + ")", nil
	case firstWait != nil:
		a := firstWait
		return machine.WaitingDesc(a.approvalOf, now.Sub(a.started)), nil
	case s.last != nil:
		return s.last.subject + ", finished " + budget.RoundHuman(now.Sub(s.lastEnded)).String() + " ago", nil
	}
	return "none", nil
}
