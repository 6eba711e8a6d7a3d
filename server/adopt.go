package server

import (
	"context"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
)

// Adopter is an EngineRunner that follows a turn another process started
// and no longer follows (package temporal's Runner): Adopt follows turn
// in.TurnID as Run follows the turns it starts — its waits for a worker
// noted, its ceiling and step window enforced when no worker runs it, a
// cancel of ctx a cancel of the turn, agent.ErrStopFollowing a stop of
// the following — and returns once it has ended or is no longer followed.
type Adopter interface {
	EngineRunner
	Adopt(ctx context.Context, in agent.Input, sinks ...event.Sink) *agent.Result
}

// DefaultAdoptInterval is how often a gateway looks for engine turns whose
// follower is gone, when Config.AdoptInterval is zero.
const DefaultAdoptInterval = 5 * time.Second

// adoptLimit bounds the turns one look adopts; the next look takes more.
const adoptLimit = 100

// adopting is the gateway's look for engine turns with no follower: a
// detached turn whose gateway is gone (killed, or shut down), or any turn
// whose `run` died. Every AdoptInterval it claims those of its agent in the
// store (store.Followers: one gateway each) and follows each as a turn of
// its own, until Shutdown (docs/decisions/adopting-engine-turns.md).
func (s *Server) adopting() {
	a, ok := s.cfg.Agent.(Adopter)
	fs, ok2 := s.cfg.Store.(store.Followers)
	if !ok || !ok2 || s.cfg.AdoptInterval < 0 {
		return
	}
	every := s.cfg.AdoptInterval
	if every == 0 {
		every = DefaultAdoptInterval
	}
	s.adopted.Add(1)
	go func() {
		defer s.adopted.Done()
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			s.adoptAll(a, fs)
			select {
			case <-s.stopAdopting:
				return
			case <-t.C:
			}
		}
	}()
}

// adoptAll claims the turns whose follower is gone and follows them.
func (s *Server) adoptAll(a Adopter, fs store.Followers) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ids, err := fs.AdoptTurns(ctx, a.Engine(), s.cfg.AgentName, adoptLimit)
	if err != nil {
		s.storeError("adopt_turns", "", err)
		return
	}
	for _, id := range ids {
		s.adopt(a, id)
	}
}

// adopt follows turn id, adopted: a live turn of this gateway's, whose
// events it streams and whose cancel it passes on, as one it started.
func (s *Server) adopt(a Adopter, id string) {
	turnCtx, cancel := context.WithCancelCause(context.Background())
	lt := &liveTurn{id: id, cancel: cancel, hub: newHub(), ended: make(chan struct{}), done: make(chan struct{}),
		suspend: make(chan struct{})}
	s.mu.Lock()
	if s.draining || s.turns[id] != nil {
		s.mu.Unlock()
		cancel(nil)
		return
	}
	s.turns[id] = lt
	s.running.Add(1)
	s.mu.Unlock()
	cancelled, unwatch := s.cfg.Store.WatchCancel(id)
	if cr, ok := s.cfg.Store.(store.CancelReasons); ok {
		// A cancel requested before: the turn of a `run` that died is
		// cancelled as client_gone as its process is taken for gone.
		if ce, err := cr.CancelReason(turnCtx, id); err == nil && ce != nil {
			lt.cancel(ce)
		}
	}
	go s.cancelled(lt, cancelled, unwatch)
	s.log.Info("turn adopted: the process that followed it is gone", "turn_id", id)
	in := agent.Input{TurnID: id, Approver: s.approver()}
	go s.run(turnCtx, lt, func(sinks ...event.Sink) *agent.Result { return a.Adopt(turnCtx, in, sinks...) })
}
