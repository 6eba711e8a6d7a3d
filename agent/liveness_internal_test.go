package agent

import (
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
)

// The watchdog's one timer is set for the earliest thing due and re-armed
// only when something brings a due time earlier. Each test looks at where
// the timer is set (due), then waits for what it fires; without the re-arm
// they fail at once on due, and would otherwise wait an hour.

// dueIn returns how far ahead the watchdog's timer is set.
func dueIn(l *liveness) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Until(l.due)
}

// A failed call ending takes away the deadline that held the step
// watchdog off: the watchdog fires a step after the last progress, not at
// that deadline an hour away.
func TestWatchdogRearmsWhenACallEnds(t *testing.T) {
	fired := make(chan *budget.TimeoutError, 1)
	step := budget.Duration{D: 100 * time.Millisecond, Source: budget.SourceDefault, Knob: "timeouts.step"}
	l := newLiveness(step, 0, time.Time{}, func(event.Payload) {}, func(te *budget.TimeoutError) { fired <- te })
	defer l.close()
	a := &activity{step: 1, subject: "tool slow", callID: "call_1_1", tool: "slow", deadline: time.Now().Add(time.Hour)}
	l.begin(a)
	// Until it first fires the timer is set for the step's time; from
	// then on, for the tool's deadline.
	for d := dueIn(l); d < 30*time.Minute; d = dueIn(l) {
		select {
		case te := <-fired:
			t.Fatalf("the watchdog fired (%v) while a tool was inside its own timeout", te)
		case <-time.After(10 * time.Millisecond):
		}
	}
	l.end(a, false) // failed: not a progress signal
	if d := dueIn(l); d > step.D {
		t.Fatalf("after the call ended the timer is set %s ahead, want within the step (%s)", d, step.D)
	}
	select {
	case te := <-fired:
		if te.Phase != budget.PhaseStep {
			t.Errorf("fired with phase %s, want %s", te.Phase, budget.PhaseStep)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the watchdog did not fire after the call that held it off ended")
	}
}

// A call starting brings its first still_working notice, which may be due
// before anything the timer is set for.
func TestWatchdogRearmsWhenACallStarts(t *testing.T) {
	notices := make(chan *event.StillWorking, 4)
	step := budget.Duration{D: time.Hour, Source: budget.SourceDefault, Knob: "timeouts.step"}
	const notice = 50 * time.Millisecond
	l := newLiveness(step, notice, time.Time{}, func(p event.Payload) {
		if sw, ok := p.(*event.StillWorking); ok {
			notices <- sw
		}
	}, func(*budget.TimeoutError) {})
	defer l.close()
	l.begin(&activity{step: 1, subject: "tool slow", callID: "call_1_1", tool: "slow", limit: time.Minute})
	if d := dueIn(l); d > notice {
		t.Fatalf("after the call started the timer is set %s ahead, want within progress_notice (%s)", d, notice)
	}
	select {
	case sw := <-notices:
		if sw.CallID != "call_1_1" {
			t.Errorf("still_working for %q, want call_1_1", sw.CallID)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no still_working for a call running past progress_notice")
	}
}

// After close returns nothing is emitted: a timer that fired just before
// finds the watchdog closed, and nothing arms it again.
func TestWatchdogSilentAfterClose(t *testing.T) {
	emitted := 0
	l := newLiveness(budget.Duration{D: time.Millisecond}, time.Millisecond, time.Time{}, func(event.Payload) { emitted++ }, func(*budget.TimeoutError) { emitted++ })
	a := &activity{step: 1, subject: "tool slow", callID: "call_1_1", tool: "slow"}
	l.begin(a)
	l.close()
	n := emitted
	l.fire() // as a timer that fired as close ran
	l.end(a, true)
	l.fire()
	if emitted != n {
		t.Errorf("%d emitted after close", emitted-n)
	}
	if !l.due.IsZero() {
		t.Errorf("armed for %s after close", l.due)
	}
}

// A stop's snapshot (freeze) is put in words later, on the turn's
// goroutine, while the calls it names go on ending and starting: it must
// still say what ran at the stop. Without the copy on write, the first
// call's end shifted the shared array under it and the snapshot named a
// call that started after the stop, or none.
func TestStopSnapshotKeepsWhatRanAtTheStop(t *testing.T) {
	l := newLiveness(budget.Duration{}, 0, time.Time{}, func(event.Payload) {}, func(*budget.TimeoutError) {})
	defer l.close()
	a := &activity{step: 1, subject: "tool crawl", callID: "call_1_1", tool: "crawl"}
	b := &activity{step: 1, subject: "tool fetch", callID: "call_1_2", tool: "fetch"}
	l.begin(a)
	l.begin(b)
	snap := l.freeze(time.Now().Add(41 * time.Second))
	l.end(a, false)
	c := &activity{step: 2, subject: "tool late", callID: "call_2_1", tool: "late"}
	l.begin(c)
	l.end(b, false)
	desc, tools := snap.describe()
	if want := "tools crawl (41s), fetch (41s) running"; desc != want || len(tools) != 2 || tools[0] != "crawl" || tools[1] != "fetch" {
		t.Errorf("the stop says %q, tools %q; want %q, [crawl fetch]", desc, tools, want)
	}
	l.mu.Lock()
	running := append([]*activity(nil), l.running...)
	l.mu.Unlock()
	if len(running) != 1 || running[0] != c {
		t.Errorf("running after the stop: %d calls, want the one started after it", len(running))
	}
	// A model call's stream that starts after the stop does not change
	// what the stop says of it.
	m := newLiveness(budget.Duration{}, 0, time.Time{}, func(event.Payload) {}, func(*budget.TimeoutError) {})
	defer m.close()
	call := &activity{step: 1, subject: "model m"}
	m.begin(call)
	snap = m.freeze(time.Now())
	m.streaming(call)
	if desc, _ := snap.describe(); desc != "model m, waiting for its reply (0s)" {
		t.Errorf("the stop says %q", desc)
	}
}
