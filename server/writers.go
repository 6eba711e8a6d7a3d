package server

import (
	"runtime"
	"sync"
)

// writers are the goroutines that drive woken streams (park.go): a fan-out
// of one event to ten thousand parked followers hands them to a few
// goroutines that are already running, instead of starting a goroutine for
// each (issue 29; docs/decisions/fan-out-writers.md).
//
// A writer never waits on one client. It writes only what the socket takes
// at once (nowWriter); a stream whose write would wait, or that has to read
// the store or wait for its turn's record, leaves the pool first: its
// goroutine goes on as the stream's own, and a new writer takes its place
// if streams are queued. So at most max writers are ever in the pool, and a
// slow client holds up no one but itself.
type writers struct {
	mu    sync.Mutex
	queue []*parked // woken streams waiting for a writer, from head
	head  int
	busy  int // writers in the pool
	max   int
}

// writer is one writer's own state; left is set when the stream it drives
// leaves the pool (leave), and the goroutine is the stream's from then on.
type writer struct {
	w    *writers
	left bool
	now  nowWriter // its writes that do not wait
}

// wake has writers drive the streams of ps that are asleep: running ones
// take them from the queue, and new ones are started while fewer than max
// are running. A fan-out's streams are queued together, under one lock.
func (w *writers) wake(ps []*parked) {
	w.mu.Lock()
	if w.max == 0 {
		w.max = runtime.GOMAXPROCS(0)
	}
	queued := len(w.queue) - w.head
	for _, p := range ps {
		if p.state.CompareAndSwap(asleep, running) {
			w.queue = append(w.queue, p)
		}
	}
	queued = len(w.queue) - w.head - queued
	start := min(w.max-w.busy, queued)
	w.busy += max(start, 0)
	w.mu.Unlock()
	for range start {
		go w.work()
	}
}

// next takes the next queued stream; nil when there is none, and the
// writer has left the pool.
func (w *writers) next() *parked {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.head == len(w.queue) {
		w.queue, w.head = w.queue[:0], 0
		w.busy--
		return nil
	}
	p := w.queue[w.head]
	w.queue[w.head] = nil
	w.head++
	return p
}

func (w *writers) work() {
	me := &writer{w: w}
	for {
		p := w.next()
		if p == nil {
			return
		}
		p.st.x.writer = me
		p.follow(p.lt, p.sb)
		if me.left {
			return
		}
	}
}

// leave takes the calling stream's goroutine out of the pool, before it
// does something that may wait; a new writer is started if streams are
// queued.
func (me *writer) leave() {
	me.left = true
	w := me.w
	w.mu.Lock()
	w.busy--
	start := w.head < len(w.queue) && w.busy < w.max
	if start {
		w.busy++
	}
	w.mu.Unlock()
	if start {
		go w.work()
	}
}
