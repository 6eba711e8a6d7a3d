package tool

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// ProgressInterval is the coalescing window of a call's progress reports:
// Hooks.OnProgress receives at most one report per call every
// ProgressInterval, plus one for each new whole percent of the report's
// total, and always the call's last report
// (docs/decisions/progress-coalescing.md).
const ProgressInterval = 100 * time.Millisecond

// maxOutbox bounds the reports waiting for a slow OnProgress. Past it the
// newest waiting report is replaced, never added to: a sink that has
// stalled costs a fixed amount of memory and shows reports at most that
// many behind, and the tool never waits.
const maxOutbox = 16

// progress is the Progress a running call is handed.
//
// A report costs the reporting goroutine a lock, a counter and a time
// stamp: the idle window and the turn's step watchdog (Hooks.OnAlive) only
// store that time. Reports that pass the coalescing rule go to an outbox
// that a goroutine of the progress's own drains into Hooks.OnProgress, so
// the goroutine reading a subprocess's stderr never waits for an event to
// be stored or published, however slow that is.
type progress struct {
	start   time.Time
	alive   func()       // Hooks.OnAlive
	deliver func(Report) // Hooks.OnProgress
	// last is the time of the last report, as time since start (so it
	// keeps the monotonic clock), for the idle window.
	last atomic.Int64

	mu     sync.Mutex
	ended  bool
	count  int
	latest report    // the last report made, when count > 0
	sent   bool      // a report has been passed on
	sentAt time.Time // when the last one was
	// maxPct is the highest whole percent of a total passed on so far,
	// -1 before any.
	maxPct float64
	held   report // the latest report not passed on, when hasHeld
	// hasHeld is set while a report waits for its window to open.
	hasHeld bool
	// trailing passes the held report on once its window opens; armed
	// while it is set to fire.
	trailing *time.Timer
	armed    bool
	outbox   []report
	// draining is non-nil while a goroutine delivers the outbox; it is
	// closed when that goroutine ends.
	draining chan struct{}
	// panicked is what the first OnProgress that panicked on the drain's
	// goroutine panicked with: Run panics with it on the call's own
	// goroutine once the call is over, where its caller can recover it,
	// rather than the drain's ending the process.
	panicked any
}

// report is a Report as made: its values copied, since a tool may reuse
// what its pointers point to once Report has returned.
type report struct {
	progress, total       float64
	hasProgress, hasTotal bool
	message               string
}

// lastReport returns the last report made, nil when none was.
func (p *progress) lastReport() *Report {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.count == 0 {
		return nil
	}
	r := Report{Message: p.latest.message}
	if p.latest.hasProgress {
		v := p.latest.progress
		r.Progress = &v
	}
	if p.latest.hasTotal {
		v := p.latest.total
		r.Total = &v
	}
	return &r
}

func copyReport(r Report) report {
	c := report{message: r.Message}
	if r.Progress != nil {
		c.progress, c.hasProgress = *r.Progress, true
	}
	if r.Total != nil {
		c.total, c.hasTotal = *r.Total, true
	}
	return c
}

// Report returns the Report that OnProgress is given.
func (c report) Report() Report {
	r := Report{Message: c.message}
	if c.hasProgress {
		r.Progress = &c.progress
	}
	if c.hasTotal {
		r.Total = &c.total
	}
	return r
}

func newProgress(start time.Time, h Hooks) *progress {
	return &progress{start: start, alive: h.OnAlive, deliver: h.OnProgress, maxPct: -1}
}

// Report implements Progress. It never blocks on the hooks.
func (p *progress) Report(rep Report) {
	now := time.Now()
	r := copyReport(rep)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ended {
		return
	}
	p.count++
	p.latest = r
	p.last.Store(int64(now.Sub(p.start)))
	if p.alive != nil {
		p.alive()
	}
	if p.deliver == nil {
		return
	}
	if p.due(r, now) {
		p.hasHeld = false
		p.send(r, now)
		return
	}
	p.held, p.hasHeld = r, true
	if !p.armed {
		p.armed = true
		wait := p.sentAt.Add(ProgressInterval).Sub(now)
		if p.trailing == nil {
			p.trailing = time.AfterFunc(wait, p.release)
		} else {
			p.trailing.Reset(wait)
		}
	}
}

// due reports whether r, made at now, is passed on at once: the call's
// first report, one made ProgressInterval or more after the last passed
// on, or one that reaches a new whole percent of its total. The percent
// rule counts only progress between 0 and the total and only upwards, so
// a tool cannot flood through it: it lets at most 101 reports through a
// call.
func (p *progress) due(r report, now time.Time) bool {
	if !p.sent || now.Sub(p.sentAt) >= ProgressInterval {
		return true
	}
	pct, ok := percent(r)
	return ok && pct > p.maxPct
}

// percent returns the whole percent of its total that r reports.
func percent(r report) (float64, bool) {
	if !r.hasProgress || !r.hasTotal || !(r.total > 0) || !(r.progress >= 0) || r.progress > r.total {
		return 0, false
	}
	return math.Floor(r.progress / r.total * 100), true
}

// send queues r for OnProgress. p.mu is held.
func (p *progress) send(r report, now time.Time) {
	p.sent, p.sentAt = true, now
	if pct, ok := percent(r); ok && pct > p.maxPct {
		p.maxPct = pct
	}
	if len(p.outbox) < maxOutbox {
		p.outbox = append(p.outbox, r)
	} else {
		p.outbox[len(p.outbox)-1] = r
	}
	if p.draining == nil {
		done := make(chan struct{})
		p.draining = done
		go p.drain(done)
	}
}

// release passes the held report on when its window has opened, and
// waits again when a report passed on since it was armed moved the window.
func (p *progress) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = false
	if p.ended || !p.hasHeld {
		return
	}
	now := time.Now()
	if wait := p.sentAt.Add(ProgressInterval).Sub(now); wait > 0 {
		p.armed = true
		p.trailing.Reset(wait)
		return
	}
	p.hasHeld = false
	p.send(p.held, now)
}

// drain delivers the outbox, one report at a time, until it is empty.
func (p *progress) drain(done chan struct{}) {
	for {
		p.mu.Lock()
		if len(p.outbox) == 0 {
			p.draining = nil
			p.mu.Unlock()
			close(done)
			return
		}
		r := p.outbox[0]
		p.outbox = p.outbox[1:]
		p.mu.Unlock()
		p.deliverOnDrain(r.Report())
	}
}

// deliverOnDrain passes r on from the drain's goroutine, keeping a panic
// of OnProgress for Run (panicked); later reports are dropped.
func (p *progress) deliverOnDrain(r Report) {
	p.mu.Lock()
	broken := p.panicked != nil
	p.mu.Unlock()
	if broken {
		return
	}
	defer func() {
		if v := recover(); v != nil {
			p.mu.Lock()
			p.panicked = v
			p.mu.Unlock()
		}
	}()
	p.deliver(r)
}

// rethrow panics with what OnProgress panicked with on the drain's
// goroutine, if it did.
func (p *progress) rethrow() {
	p.mu.Lock()
	v := p.panicked
	p.mu.Unlock()
	if v != nil {
		panic(v)
	}
}

// end stops accepting reports, delivers what is waiting — the call's last
// report included, held or not — and returns the number of reports
// accepted. When it returns, OnProgress is not running and will not be
// called again.
func (p *progress) end() int {
	p.mu.Lock()
	p.ended = true
	if p.trailing != nil {
		p.trailing.Stop() // a release already under way finds ended
	}
	if p.hasHeld {
		p.hasHeld = false
		if len(p.outbox) < maxOutbox {
			p.outbox = append(p.outbox, p.held)
		} else {
			p.outbox[len(p.outbox)-1] = p.held
		}
	}
	draining := p.draining
	var rest []report
	if draining == nil {
		rest, p.outbox = p.outbox, nil
	}
	n := p.count
	p.mu.Unlock()
	if draining != nil {
		// It delivers everything queued before it stops. When OnProgress
		// is too slow to do that within a window, what still waits is
		// merged into the last report, so that a slow sink delays the end
		// of the call by two of its calls at most.
		t := time.NewTimer(ProgressInterval)
		select {
		case <-draining:
		case <-t.C:
			p.mu.Lock()
			if k := len(p.outbox); k > 1 {
				p.outbox = p.outbox[k-1:]
			}
			p.mu.Unlock()
			<-draining
		}
		t.Stop()
	}
	for _, r := range rest {
		p.deliver(r.Report())
	}
	return n
}

// idleWindow is a call's idle_timeout (spec §2). A report only stores its
// time (progress.last); the timer, when it fires, re-arms itself for what
// is left of the window after the last report, or fires the timeout.
// Resetting a timer for each of a flood of reports would cost the reading
// goroutine far more.
type idleWindow struct {
	d    time.Duration
	p    *progress
	fire func()

	mu      sync.Mutex
	stopped bool
	t       *time.Timer
}

func (p *progress) idleWindow(d time.Duration, fire func()) *idleWindow {
	w := &idleWindow{d: d, p: p, fire: fire}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.t = time.AfterFunc(d, w.check)
	return w
}

func (w *idleWindow) check() {
	w.mu.Lock()
	if w.stopped {
		w.mu.Unlock()
		return
	}
	since := time.Since(w.p.start) - time.Duration(w.p.last.Load())
	if left := w.d - since; left > 0 {
		w.t.Reset(left)
		w.mu.Unlock()
		return
	}
	w.stopped = true
	w.mu.Unlock()
	w.fire()
}

func (w *idleWindow) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.t.Stop()
}
