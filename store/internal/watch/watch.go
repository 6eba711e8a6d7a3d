// Package watch is the registry of watchers the stores share: followers
// waiting for a turn's next events (store.Store.Watch) and running turns
// waiting for a cancel request (store.Store.WatchCancel).
//
// A watcher's channel has room for one signal and a signal that finds it
// full is dropped: signals say "look again", never what changed, so the
// watcher re-reads the store after each and nothing is lost by coalescing.
package watch

import (
	"slices"
	"sync"
)

// Set holds the watchers of turns, by turn id. The zero value is ready to
// use; it is safe for concurrent use.
type Set struct {
	mu    sync.Mutex
	turns map[string]map[chan struct{}]struct{}
}

// Add registers a watcher of turn id and returns its channel and the
// function that removes it (idempotent).
func (s *Set) Add(id string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	if s.turns == nil {
		s.turns = map[string]map[chan struct{}]struct{}{}
	}
	w := s.turns[id]
	if w == nil {
		w = map[chan struct{}]struct{}{}
		s.turns[id] = w
	}
	w[ch] = struct{}{}
	s.mu.Unlock()
	var once sync.Once
	return ch, func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			delete(s.turns[id], ch)
			if len(s.turns[id]) == 0 {
				delete(s.turns, id)
			}
		})
	}
}

// Wake signals every watcher of turn id.
func (s *Set) Wake(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.turns[id] {
		signal(ch)
	}
}

// WakeAll signals every watcher.
func (s *Set) WakeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.turns {
		for ch := range w {
			signal(ch)
		}
	}
}

// Watched reports whether turn id has a watcher.
func (s *Set) Watched(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.turns[id]) > 0
}

// IDs returns the ids of the watched turns, sorted.
func (s *Set) IDs() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.turns))
	for id := range s.turns {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// Len returns the number of watched turns.
func (s *Set) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.turns)
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
