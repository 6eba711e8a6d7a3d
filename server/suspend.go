package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
)

// Resumer is a Runner that goes on with a suspended turn (agent.Resume):
// *agent.Agent and *timebox.Agent are Resumers.
type Resumer interface {
	Resume(ctx context.Context, cp *agent.Checkpoint, in agent.Input, sinks ...event.Sink) (*agent.Result, error)
}

// suspender returns the store's Suspender when the server's turns can be
// suspended and resumed: they run in this process (no engine), on a
// Resumer, over a Suspender store.
func (s *Server) suspender() store.Suspender {
	sp, ok := s.cfg.Store.(store.Suspender)
	if _, resumes := s.cfg.Agent.(Resumer); !ok || !resumes || engineOf(s.cfg.Agent) != "" {
		return nil
	}
	return sp
}

// suspended stores the checkpoint of a turn suspended as the server
// stops: the turn stays running in the store, owned by no server, and the
// next server — or the gateway a decision reaches first — resumes it.
func (s *Server) suspended(lt *liveTurn, cp *agent.Checkpoint) {
	close(lt.ended)
	s.storeRefused(lt)
	b, err := json.Marshal(cp)
	if err == nil {
		err = s.suspender().SuspendTurn(context.Background(), lt.id, b)
	}
	if err != nil {
		s.storeError("suspend_turn", lt.id, err)
	}
	lt.hub.end()
	s.forget(lt)
	close(lt.done)
	s.log.Info("turn suspended while it waited for people; the next server resumes it", "turn_id", lt.id)
}

// storeRefused stores again the events of a turn being suspended that
// the store refused as it ran (a full disk, since freed). A turn that ends
// here stores them with its end (store.EndOf), but a suspended turn's end,
// in the next server, knows only the events after its checkpoint, so
// nothing else would. The hub still holds them (hub.refused); appending
// an event already stored is a no-op. What the store refuses again is
// lost, and the log says which.
func (s *Server) storeRefused(lt *liveTurn) {
	if lt.hub.refusals() == 0 {
		return
	}
	ctx := context.Background()
	if err := s.cfg.Store.Flush(ctx); err != nil {
		s.storeError("flush", lt.id, err)
	}
	var (
		mu   sync.Mutex
		lost []int64
	)
	for _, f := range lt.hub.unstored() {
		var e event.Event
		if err := json.Unmarshal(f.data.Bytes(), &e); err != nil {
			lost = append(lost, f.seq)
			continue
		}
		s.cfg.Store.QueueEvent(e, func(err error) {
			if err != nil {
				mu.Lock()
				lost = append(lost, e.Seq)
				mu.Unlock()
			}
		})
	}
	if err := s.cfg.Store.Flush(ctx); err != nil {
		s.storeError("flush", lt.id, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lost) > 0 {
		slices.Sort(lost)
		s.log.Error("the turn was suspended before the store took the events it refused: they are lost", "turn_id", lt.id, "seqs", lost)
		return
	}
	s.log.Info("the turn's suspension stored the events the store refused as it ran", "turn_id", lt.id, "events", lt.hub.refusals())
}

// resumeSuspended resumes every suspended turn of the store: a server
// starting takes over the turns the last one suspended.
func (s *Server) resumeSuspended(ctx context.Context) {
	sp := s.suspender()
	if sp == nil {
		return
	}
	ids, err := sp.SuspendedTurns(ctx)
	if err != nil {
		s.storeError("suspended_turns", "", err)
		return
	}
	for _, id := range ids {
		if err := s.resume(ctx, id); err != nil && !errors.Is(err, store.ErrNotFound) {
			s.log.Error("resuming a suspended turn failed", "turn_id", id, "err", err)
		}
	}
}

// resume claims the suspended turn id and runs it on from its checkpoint
// in this server. ErrNotFound: it is not suspended (another server took
// it).
func (s *Server) resume(ctx context.Context, id string) error {
	sp := s.suspender()
	if sp == nil {
		return fmt.Errorf("turn %s: %w", id, store.ErrNotFound)
	}
	s.mu.Lock()
	draining := s.draining
	s.mu.Unlock()
	if draining {
		return errDraining
	}
	b, err := sp.ResumeTurn(ctx, id)
	if err != nil {
		return err
	}
	var cp agent.Checkpoint
	if err := json.Unmarshal(b, &cp); err != nil {
		return fmt.Errorf("reading the checkpoint of turn %s: %w", id, err)
	}
	turnCtx, cancel := context.WithCancelCause(context.Background())
	lt := &liveTurn{id: id, session: cp.State.SessionID, cancel: cancel, hub: newHubAfter(cp.Seq), ended: make(chan struct{}),
		done: make(chan struct{}), suspend: make(chan struct{})}
	s.mu.Lock()
	s.turns[id] = lt
	if lt.session != "" {
		s.sessions[lt.session] = id
	}
	s.running.Add(1)
	s.mu.Unlock()
	cancelled, unwatch := s.cfg.Store.WatchCancel(id)
	go s.cancelled(lt, cancelled, unwatch)
	r := s.cfg.Agent.(Resumer)
	in := agent.Input{Approver: s.approver(), Suspend: lt.suspend}
	s.log.Info("turn resumed", "turn_id", id)
	go s.run(turnCtx, lt, func(sinks ...event.Sink) *agent.Result {
		res, err := r.Resume(turnCtx, &cp, in, sinks...)
		if err != nil {
			// Another agent than the one that began it: ended here, as
			// the store records an interrupted turn.
			s.log.Error("resuming a suspended turn failed", "turn_id", id, "err", err)
			return &agent.Result{Record: interruptedRecord(&cp, err)}
		}
		return res
	})
	return nil
}

// interruptedRecord is the record of a suspended turn that could not be
// resumed here: the server runs another agent than the one that began it.
func interruptedRecord(cp *agent.Checkpoint, err error) *event.Turn {
	now := time.Now()
	return &event.Turn{TurnID: cp.State.TurnID, SessionID: cp.State.SessionID, Input: cp.Text, Status: budget.AgentMismatch.Status(),
		StopReason: budget.AgentMismatch, Message: "Not resumed: " + err.Error(), StartedAt: cp.State.Start, EndedAt: now,
		WallMS: now.Sub(cp.State.Start).Milliseconds(), Steps: cp.State.Steps, ToolCalls: cp.Tools, ModelCalls: cp.Models}
}
