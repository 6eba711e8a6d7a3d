package agent

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
)

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
	nextNotice time.Time
}

// liveness is the turn's step watchdog and still_working notifier. It fires
// stop when nothing has progressed for the step budget and no running tool
// is still inside its own timeout; it emits still_working for every
// activity that has run for progress_notice, then every interval after.
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
	running      map[*activity]struct{}
	last         *activity // the most recently started activity
	lastEnded    time.Time
	fired        bool

	poke chan struct{}
	quit chan struct{}
	done chan struct{}
}

func newLiveness(step budget.Duration, notice time.Duration, emit func(event.Payload), stop func(*budget.TimeoutError)) *liveness {
	now := time.Now()
	l := &liveness{
		step: step, notice: notice, emit: emit, stop: stop,
		base: now, lastProgress: now,
		running: map[*activity]struct{}{},
		poke:    make(chan struct{}, 1),
		quit:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	go l.loop()
	return l
}

// progress records a progress signal: a stream chunk, a tool's progress
// report, a call completing.
func (l *liveness) progress() {
	l.mu.Lock()
	l.lastProgress = time.Now()
	l.mu.Unlock()
	l.wake()
}

// alive records a tool's progress report. A flooding tool calls it for
// each of thousands of reports, on the goroutine reading its output, so it
// only stores the time: the watchdog's timer, when it fires, finds the
// later time and waits again (progress can only move its deadline later).
func (l *liveness) alive() { l.lastAlive.Store(int64(time.Since(l.base))) }

// syncAlive folds the last report's time into lastProgress. l.mu is held.
func (l *liveness) syncAlive() {
	if a := l.base.Add(time.Duration(l.lastAlive.Load())); a.After(l.lastProgress) {
		l.lastProgress = a
	}
}

func (l *liveness) begin(a *activity) {
	l.mu.Lock()
	a.started = time.Now()
	if l.notice > 0 {
		a.nextNotice = a.started.Add(l.notice)
	}
	l.running[a] = struct{}{}
	l.last = a
	l.mu.Unlock()
	l.wake()
}

// end removes a. A call that completed is a progress signal; one that
// failed is not.
func (l *liveness) end(a *activity, completed bool) {
	l.mu.Lock()
	delete(l.running, a)
	l.lastEnded = time.Now()
	if completed {
		l.lastProgress = l.lastEnded
	}
	l.mu.Unlock()
	l.wake()
}

func (l *liveness) streaming(a *activity) {
	l.mu.Lock()
	a.streaming = true
	l.mu.Unlock()
}

func (l *liveness) wake() {
	select {
	case l.poke <- struct{}{}:
	default:
	}
}

// close stops the watchdog and waits for its goroutine.
func (l *liveness) close() {
	close(l.quit)
	<-l.done
}

func (l *liveness) loop() {
	defer close(l.done)
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		next, ok := l.check(time.Now())
		if ok {
			t.Reset(time.Until(next))
		} else {
			t.Stop()
		}
		select {
		case <-t.C:
		case <-l.poke:
		case <-l.quit:
			return
		}
	}
}

// check fires what is due at now and returns when to look again.
func (l *liveness) check(now time.Time) (next time.Time, ok bool) {
	l.mu.Lock()
	var notices []*event.StillWorking
	consider := func(t time.Time) {
		if !ok || t.Before(next) {
			next, ok = t, true
		}
	}
	for a := range l.running {
		if a.nextNotice.IsZero() {
			continue
		}
		if !now.Before(a.nextNotice) {
			notices = append(notices, &event.StillWorking{Step: a.step, Subject: a.subject, CallID: a.callID,
				ElapsedMS: now.Sub(a.started).Milliseconds(), LimitMS: a.limit.Milliseconds()})
			for !now.Before(a.nextNotice) {
				a.nextNotice = a.nextNotice.Add(l.notice)
			}
		}
		consider(a.nextNotice)
	}
	var fire *budget.TimeoutError
	l.syncAlive()
	if !l.step.Off() && !l.fired && !l.advisoryRunningLocked() {
		due := l.lastProgress.Add(l.step.D)
		for a := range l.running {
			if a.deadline.After(due) {
				due = a.deadline
			}
		}
		if !now.Before(due) {
			l.fired = true
			fire = l.step.Expired(budget.PhaseStep, "the turn", now.Sub(l.lastProgress))
		} else {
			consider(due)
		}
	}
	l.mu.Unlock()
	sort.Slice(notices, func(i, j int) bool { return notices[i].CallID < notices[j].CallID })
	for _, n := range notices {
		l.emit(n)
	}
	if fire != nil {
		l.stop(fire)
	}
	return next, ok
}

// advisoryRunningLocked reports whether an advisory tool call is running;
// while one is, the step watchdog does not fire. Its end is a progress
// signal (end with completed), which starts a fresh step window. l.mu is
// held.
func (l *liveness) advisoryRunningLocked() bool {
	for a := range l.running {
		if a.advisory {
			return true
		}
	}
	return false
}

// compacting reports whether a history compaction is running.
func (l *liveness) compacting() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for a := range l.running {
		if a.compaction {
			return true
		}
	}
	return false
}

// describe says what the turn was doing at now, for messages: "tool crawl,
// running for 41s", "model gpt-4o, waiting for its reply".
func (l *liveness) describe(now time.Time) (desc string, tools []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var acts []*activity
	for a := range l.running {
		acts = append(acts, a)
	}
	sort.Slice(acts, func(i, j int) bool { return acts[i].started.Before(acts[j].started) })
	var toolActs []*activity
	for _, a := range acts {
		if a.tool != "" {
			toolActs = append(toolActs, a)
			tools = append(tools, a.tool)
		}
	}
	switch {
	case len(toolActs) == 1:
		a := toolActs[0]
		return fmt.Sprintf("tool %s, running for %s", a.tool, roundHuman(now.Sub(a.started))), tools
	case len(toolActs) > 1:
		var parts []string
		for _, a := range toolActs {
			parts = append(parts, fmt.Sprintf("%s (%s)", a.tool, roundHuman(now.Sub(a.started))))
		}
		return "tools " + strings.Join(parts, ", ") + " running", tools
	case len(acts) > 0:
		a := acts[0]
		if a.streaming {
			return fmt.Sprintf("%s, streaming its reply (%s)", a.subject, roundHuman(now.Sub(a.started))), nil
		}
		return fmt.Sprintf("%s, waiting for its reply (%s)", a.subject, roundHuman(now.Sub(a.started))), nil
	case l.last != nil:
		return fmt.Sprintf("%s, finished %s ago", l.last.subject, roundHuman(now.Sub(l.lastEnded))), nil
	}
	return "none", nil
}

// roundHuman rounds for a sentence: whole seconds above ten seconds, tenths
// below.
func roundHuman(d time.Duration) time.Duration {
	if d >= 10*time.Second {
		return d.Round(time.Second)
	}
	return d.Round(100 * time.Millisecond)
}
