package server

import (
	"sync"
	"time"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/longjson"
)

// frame is one event ready to send: marshalled once, whoever reads it.
type frame struct {
	seq int64
	typ event.Type
	at  time.Time
	// data is the event's JSON (event.MarshalDoc): one buffer, or, for an
	// event with a long text, its JSON around the event's own string, which
	// each follower's writer escapes a piece at a time. A frame held for
	// the store, or sent to no one, costs a long answer nothing.
	data longjson.Doc
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
// whatever the timing and however far behind the store is, and even when
// the store refused an event for good (refused).
type hub struct {
	mu     sync.Mutex
	last   int64   // the last seq published
	stored int64   // every event up to it is in the store
	pend   []frame // published and not yet stored: (stored, last]
	// hole is the first event the store refused for good (a full disk),
	// 0 if none: stored stays below it, so the hub keeps it and every
	// event after it for followers that replay (refused).
	hole    int64
	refuses int // how many events the store refused
	ended   bool
	subs    map[*sub]struct{}
	lags    int // followers cut loose, for tests
}

// sub is one follower's subscription.
type sub struct {
	lagged bool // under the hub's lock

	// mu guards the rest, which it is its own lock, not the hub's, so
	// that a follower taking its frames or parking does not contend with
	// the fan-out.
	mu sync.Mutex
	// q holds the frames published after the subscription's start that the
	// follower has not taken, subBuffer at most. Each frame is shared by
	// every follower, and an idle follower's q is empty: a buffer of 256
	// frames by value cost each follower 18 KiB, a channel of pointers 2
	// KiB (issue 29).
	q []*frame
	// closed: no frame comes after q's, because the turn has ended or the
	// follower fell behind (lagged).
	closed bool
	// ready has a token when q has grown or s closed, for a follower's
	// goroutine to wait on; wake, when set, is woken once instead: a
	// parked follower (park.go), which has no goroutine waiting.
	ready chan struct{}
	wake  *parked
}

// send hands f to s if its buffer has room; it returns s's parked stream,
// once, if it parked.
func (s *sub) send(f *frame) (sent bool, wake *parked) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.q) >= subBuffer {
		return false, nil
	}
	s.q = append(s.q, f)
	return true, s.signal()
}

// shut closes s; it returns s's parked stream, once, if it parked.
func (s *sub) shut() (wake *parked) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return s.signal()
}

// signal tells s's follower it has something to take, under s.mu.
func (s *sub) signal() (wake *parked) {
	select {
	case s.ready <- struct{}{}:
	default:
	}
	wake, s.wake = s.wake, nil
	return wake
}

// take returns the frames s has; open is false once s is closed and its
// last frames are taken (with them).
func (s *sub) take() (fs []*frame, open bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fs, s.q = s.q, nil
	return fs, !s.closed
}

// recycle gives s back a small slice take returned, emptied, for its next
// frames: an event that reaches ten thousand followers does not allocate
// for each.
func (s *sub) recycle(fs []*frame) {
	if cap(fs) > 16 {
		return
	}
	clear(fs)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.q == nil {
		s.q = fs[:0]
	}
}

// park arranges for p to be woken when s has a frame or is closed. It
// returns false, and arranges nothing, if s has one or is closed already.
func (s *sub) park(p *parked) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || len(s.q) > 0 {
		return false
	}
	s.wake = p
	return true
}

// wakeAll wakes the parked streams the hub collected, once it let go of
// its lock, handing them to the writers at once (writers.go).
func wakeAll(wakes []*parked) {
	if len(wakes) > 0 {
		wakes[0].s.writers.wake(wakes)
	}
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
	s = &sub{ready: make(chan struct{}, 1)}
	h.subs[s] = struct{}{}
	return s, h.stored, pending
}

// unsubscribe removes s; it is safe after the hub closed s.
func (h *hub) unsubscribe(s *sub) {
	h.mu.Lock()
	_, ok := h.subs[s]
	delete(h.subs, s)
	h.mu.Unlock()
	if ok {
		if p := s.shut(); p != nil {
			p.wake()
		}
	}
}

// publish hands f to every follower without blocking: one whose buffer is
// full is cut loose (lagged) and catches up (subscribe). f is pending until
// stored says the store has it. Parked followers are handed to the
// writers wakeBatch at a time as the loop goes: the first are written to
// while the hub hands out the rest (a writer takes no hub lock to write).
func (h *hub) publish(f frame) {
	var wakes []*parked
	h.mu.Lock()
	h.last = f.seq
	h.pend = append(h.pend, f)
	fp := &f
	for s := range h.subs {
		sent, w := s.send(fp)
		if !sent {
			s.lagged = true
			h.lags++
			delete(h.subs, s)
			w = s.shut()
		}
		if w != nil {
			wakes = append(wakes, w)
			if len(wakes) == wakeBatch {
				wakeAll(wakes)
				wakes = wakes[:0]
			}
		}
	}
	h.mu.Unlock()
	wakeAll(wakes)
}

// wakeBatch is how many parked followers a fan-out hands the writers at a
// time while it goes on handing out the frame.
const wakeBatch = 256

// storedUpTo notes that the store has every event up to seq, but for
// those it refused (refused).
func (h *hub) storedUpTo(seq int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.hole != 0 {
		seq = min(seq, h.hole-1)
	}
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

// refused notes that the store refused the event seq for good: it is not
// in the store until the turn's end stores what the store lacks
// (store.EndOf), so the hub keeps it, and the events after it, for the
// followers that replay the store. A follower that replayed the store past
// it would skip it. What the hub keeps then grows with the turn until its
// end, as the turn's own log does.
func (h *hub) refused(seq int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.hole == 0 || seq < h.hole {
		h.hole = seq
	}
	h.refuses++
}

// unstored returns (a copy of) the frames the hub keeps because the store
// does not have them, or may not: from the first it refused on.
func (h *hub) unstored() []frame {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]frame(nil), h.pend...)
}

// refusals returns how many events the store refused (refused).
func (h *hub) refusals() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.refuses
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
	var wakes []*parked
	h.mu.Lock()
	h.ended = true
	for s := range h.subs {
		delete(h.subs, s)
		if w := s.shut(); w != nil {
			wakes = append(wakes, w)
		}
	}
	h.mu.Unlock()
	wakeAll(wakes)
}

// isLagged reports whether s was cut loose for falling behind. Read it
// once s is closed.
func (h *hub) isLagged(s *sub) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return s.lagged
}
