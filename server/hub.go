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
// The turn's sink publishes each event as it is emitted — the live stream
// never waits for the store (docs/decisions/store-outages.md) — and tells
// the hub once the store has committed it (stored, in seq order). Until
// then the hub keeps the event (pending), so that a follower that
// subscribes, or catches up after falling behind, replays (after, stored]
// from the store, then the pending events, then takes the live ones from
// its channel: exactly the events it missed, no gap, no duplicate,
// whatever the timing and however far behind the store is.
type hub struct {
	mu     sync.Mutex
	last   int64   // the last seq published
	stored int64   // every event up to it is in the store
	pend   []frame // published and not yet stored: (stored, last]
	ended  bool
	subs   map[*sub]struct{}
	lags   int // followers cut loose, for tests
}

// sub is one follower's subscription.
type sub struct {
	// ch carries the frames after the subscription's start. It is closed
	// when the turn has ended or the follower fell behind (lagged). Each
	// frame is shared by every follower: a buffer of pointers costs an idle
	// follower 2 KiB, where one of frames cost 18 KiB (issue 29).
	ch     chan *frame
	lagged bool
}

func newHub() *hub { return &hub{subs: map[*sub]struct{}{}} }

// newHubAfter is the hub of a turn resumed after its event seq: the store
// has every event up to it.
func newHubAfter(seq int64) *hub {
	return &hub{subs: map[*sub]struct{}{}, last: seq, stored: seq}
}

// subscribe returns a subscription to the frames published after it, the
// seq up to which the store has every event, and the frames published
// after that one (a copy). If the turn has already ended, sub is nil: the
// store and the pending frames have all its events.
func (h *hub) subscribe() (s *sub, stored int64, pending []frame) {
	h.mu.Lock()
	defer h.mu.Unlock()
	pending = append([]frame(nil), h.pend...)
	if h.ended {
		return nil, h.stored, pending
	}
	s = &sub{ch: make(chan *frame, subBuffer)}
	h.subs[s] = struct{}{}
	return s, h.stored, pending
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
// full is cut loose (lagged) and catches up (subscribe). f is pending until
// stored says the store has it.
func (h *hub) publish(f frame) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = f.seq
	h.pend = append(h.pend, f)
	fp := &f
	for s := range h.subs {
		select {
		case s.ch <- fp:
		default:
			s.lagged = true
			h.lags++
			delete(h.subs, s)
			close(s.ch)
		}
	}
}

// storedUpTo notes that the store has every event up to seq (or has given
// up on it: either way it is no longer the hub's to keep).
func (h *hub) storedUpTo(seq int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if seq <= h.stored {
		return
	}
	h.stored = seq
	n := 0
	for n < len(h.pend) && h.pend[n].seq <= seq {
		n++
	}
	h.pend = append(h.pend[:0], h.pend[n:]...)
}

// behind returns how many published events the store does not have yet.
func (h *hub) behind() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.pend)
}

// end marks the turn over and closes every subscription; followers drain
// what is buffered. Its pending frames stay until stored.
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
