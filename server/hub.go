package server

import (
	"sync"
	"time"

	"github.com/timebox-run/timebox/event"
)

// frame is one event ready to send: marshalled once, whoever reads it.
type frame struct {
	seq  int64
	typ  event.Type
	at   time.Time
	data []byte
}

// subBuffer is how many frames a follower may fall behind the turn before
// it is cut loose and catches up from the store instead. A slow client
// never holds a turn back.
const subBuffer = 256

// hub fans one live turn's events out to its followers.
//
// The turn's sink publishes each event only once the store has committed
// it (from the store's QueueEvent callback, in seq order), so when a
// follower subscribes, every event up to the hub's last seq is already in
// the store: the follower replays (after, last] from the store and then
// takes (last, …] from its channel — exactly the missed events, no gap, no
// duplicate, whatever the timing.
type hub struct {
	mu    sync.Mutex
	last  int64
	ended bool
	subs  map[*sub]struct{}
	lags  int // followers cut loose, for tests
}

// sub is one follower's subscription.
type sub struct {
	// ch carries the frames after the subscription's start. It is closed
	// when the turn has ended or the follower fell behind (lagged).
	ch     chan frame
	lagged bool
}

func newHub() *hub { return &hub{subs: map[*sub]struct{}{}} }

// subscribe returns a subscription to the frames after the hub's current
// last seq, and that seq. If the turn has already ended, sub is nil: all its
// events are in the store.
func (h *hub) subscribe() (*sub, int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ended {
		return nil, h.last
	}
	s := &sub{ch: make(chan frame, subBuffer)}
	h.subs[s] = struct{}{}
	return s, h.last
}

// unsubscribe removes s; it is safe after the hub closed s.
func (h *hub) unsubscribe(s *sub) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[s]; ok {
		delete(h.subs, s)
		close(s.ch)
	}
}

// publish hands f to every follower without blocking: one whose buffer is
// full is cut loose (lagged) and catches up from the store.
func (h *hub) publish(f frame) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = f.seq
	for s := range h.subs {
		select {
		case s.ch <- f:
		default:
			s.lagged = true
			h.lags++
			delete(h.subs, s)
			close(s.ch)
		}
	}
}

// end marks the turn over and closes every subscription; followers drain
// what is buffered.
func (h *hub) end() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ended = true
	for s := range h.subs {
		delete(h.subs, s)
		close(s.ch)
	}
}

// isLagged reports whether s was cut loose for falling behind. Read it
// after s.ch is closed.
func (h *hub) isLagged(s *sub) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return s.lagged
}
