package server_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/sqlite"
)

// heldStore is a store whose writes do not go through until it is let go,
// as a database that is away or a table that is locked: the events queued
// meanwhile are kept, in order, and FinishTurn waits.
type heldStore struct {
	store.Store
	mu      sync.Mutex
	held    bool
	waiting []func()
	release chan struct{}
}

func newHeldStore() *heldStore {
	return &heldStore{Store: store.NewMemory(), held: true, release: make(chan struct{})}
}

func (s *heldStore) QueueEvent(e event.Event, committed func(error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held {
		s.waiting = append(s.waiting, func() { s.Store.QueueEvent(e, committed) })
		return
	}
	s.Store.QueueEvent(e, committed)
}

func (s *heldStore) FinishTurn(ctx context.Context, rec *event.Turn, msgs []model.Message) error {
	<-s.release
	return s.Store.FinishTurn(ctx, rec, msgs)
}

// letGo stores what was kept, in order, and lets the writes through.
func (s *heldStore) letGo() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.waiting {
		w()
	}
	s.held, s.waiting = false, nil
	close(s.release)
}

// TestTheStreamNeverWaitsForTheStore: while the store takes no write, the
// turn runs to its end, its client gets every event and turn_finished, a
// follower that joins after the end gets them all too (from what the
// gateway published and has not stored), and once the store is back the
// record holds every event, with the turn's own wall_ms.
func TestTheStreamNeverWaitsForTheStore(t *testing.T) {
	st := newHeldStore()
	e := newEnv(t, server.Config{Store: st, Agent: newAgent(t, scripted(t, `{"text": "hello there"}`))})
	posted := time.Now()
	resp, sse := e.stream(t.Context(), map[string]any{"input": "hi"})
	id := resp.Header.Get(server.HeaderTurnID)
	defer resp.Body.Close()
	evs := sse.until(t, "turn_finished")
	took := time.Since(posted)
	// One record (llm_finished) waits at most store.RecordWait; nothing
	// else waits for the store.
	if took > store.RecordWait+2*time.Second {
		t.Errorf("turn_finished came %s after the post while the store was held", took)
	}
	checkSeqs(t, evs)

	late := e.do("GET", "/v1/turns/"+id+"/events?after=0", nil)
	defer late.Body.Close()
	lateSSE := newSSE(late.Body)
	if again := lateSSE.until(t, "turn_finished"); len(again) != len(evs) {
		t.Fatalf("a follower joining after the end got %d events of %d", len(again), len(evs))
	}

	st.letGo()
	// The streams close once the record is stored (or 5 s after
	// turn_finished, for a store that stays away).
	for _, r := range []*sseReader{sse, lateSSE} {
		if rest := r.all(t); len(rest) > 0 {
			t.Fatalf("%d events after turn_finished", len(rest))
		}
	}
	var rec *event.Turn
	for deadline := time.Now().Add(10 * time.Second); rec == nil; time.Sleep(10 * time.Millisecond) {
		if r, err := st.Turn(context.Background(), id); err == nil && r.Status != budget.StatusRunning {
			rec = r
		}
		if time.Now().After(deadline) {
			t.Fatal("the turn's end was not stored once the store was let go")
		}
	}
	stored, err := st.Events(context.Background(), id, 0, 0)
	if err != nil || len(stored) != len(evs) {
		t.Fatalf("%d events stored of %d streamed (%v)", len(stored), len(evs), err)
	}
	if rec.Status != budget.StatusCompleted || rec.WallMS > took.Milliseconds() {
		t.Errorf("stored %s, wall_ms %d (the turn took at most %s)", rec.Status, rec.WallMS, took)
	}
	h := e.do("GET", "/healthz", nil)
	h.Body.Close()
	if h.StatusCode != http.StatusOK {
		t.Errorf("/healthz %d after", h.StatusCode)
	}
}

// refusal refuses the turn's first llm_finished for good, as a full disk
// refuses a write (SQLITE_FULL is not tried again): it is not in the store
// until the turn's end stores what the store lacks (store.EndOf). With
// again, it refuses that event each time it is given.
type refusal struct {
	mu      sync.Mutex
	refused int64
	again   bool
}

// refuses reports whether e is refused.
func (r *refusal) refuses(e event.Event) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	refuse := e.Type == event.TypeLLMFinished && (r.refused == 0 || r.again && e.Seq == r.refused)
	if refuse {
		r.refused = e.Seq
	}
	return refuse
}

func (r *refusal) refusedSeq() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.refused
}

// errFull is how a full disk refuses a write.
var errFull = errors.New("database or disk is full")

// refusingStore is a store with a refusal.
type refusingStore struct {
	store.Store
	refusal
}

func (s *refusingStore) QueueEvent(e event.Event, committed func(error)) {
	if s.refuses(e) {
		committed(errFull)
		return
	}
	s.Store.QueueEvent(e, committed)
}

// TestAnEventTheStoreRefusedIsNotLost: a follower that joins the turn
// after the store refused an event, and stored those after it, still gets
// that event in its place (the gateway keeps it); the turn's end stores it,
// and the log says so after the error it logged for it.
func TestAnEventTheStoreRefusedIsNotLost(t *testing.T) {
	var logged syncbuf.Buffer
	st := &refusingStore{Store: openStore(t)}
	g := newGate("wait")
	e := newEnv(t, server.Config{Store: st, Agent: newAgent(t, scripted(t, waitThenAnswer...), g.tool()),
		Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	resp, sse := e.stream(t.Context(), map[string]any{"input": "hi"})
	defer resp.Body.Close()
	id := resp.Header.Get(server.HeaderTurnID)
	<-g.started // llm_finished was refused, tool_started is stored

	joined := e.do("GET", "/v1/turns/"+id+"/events?after=0", nil)
	defer joined.Body.Close()
	late := newSSE(joined.Body)
	seen := late.until(t, "tool_started")
	g.open()
	seen = append(seen, late.until(t, "turn_finished")...)
	checkSeqs(t, seen)
	if len(seen) != len(sse.until(t, "turn_finished")) {
		t.Fatalf("a follower that joined got %d events; the turn's client more", len(seen))
	}
	if st.refusedSeq() == 0 {
		t.Fatal("the store refused nothing: the test did not test a refusal")
	}

	wait.For(t, 10*time.Second, "the turn's end stored", func() bool {
		s, _ := e.storedStatus(id)
		return s != budget.StatusRunning
	})
	stored, err := st.Events(context.Background(), id, 0, 0)
	if err != nil || len(stored) != len(seen) {
		t.Fatalf("%d events stored of %d (%v)", len(stored), len(seen), err)
	}
	// The line is logged once FinishTurn has returned, which may be after
	// the end is seen stored.
	var log string
	said := wait.Until(10*time.Second, func() bool {
		log = logged.String()
		fail := strings.Index(log, "store write failed")
		made := strings.Index(log, "the turn's end stored the events the store refused as it ran")
		return fail >= 0 && made > fail && strings.Contains(log[made:], "events=1")
	})
	if !said {
		t.Errorf("the log does not say the end stored the refused event:\n%s", log)
	}
}

// refusingSQLite is a SQLite store, with all it can do (suspend turns,
// keep approvals), and a refusal.
type refusingSQLite struct {
	*sqlite.Store
	refusal
}

func (s *refusingSQLite) QueueEvent(e event.Event, committed func(error)) {
	if s.refuses(e) {
		committed(errFull)
		return
	}
	s.Store.QueueEvent(e, committed)
}

// TestARefusedEventOutlivesASuspension: a turn suspended as serve stops
// (it waits for a person) stores the event the store refused as it ran
// before it is suspended: the next server's end of it knows only the
// events after its checkpoint. If the store refuses it again, the log
// says which event is lost.
func TestARefusedEventOutlivesASuspension(t *testing.T) {
	for _, again := range []bool{false, true} {
		t.Run(map[bool]string{false: "the disk has room again", true: "the disk is still full"}[again], func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "timebox.db")
			sq, err := sqlite.Open(path, sqlite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			st := &refusingSQLite{Store: sq, refusal: refusal{again: again}}
			var logged syncbuf.Buffer
			a := newEnv(t, server.Config{Store: st, Agent: newAgent(t, scripted(t, deployThenAnswer...), deployTool(0)),
				Logger: slog.New(slog.NewTextHandler(&logged, nil))})
			acc := decode[server.TurnAccepted](t, a.do("POST", "/v1/turns", map[string]any{"input": "deploy", "detach": true}), http.StatusAccepted)
			a.waitPending(acc.TurnID)
			if err := a.stop(); err != nil {
				t.Fatal(err)
			}
			if st.refusedSeq() == 0 {
				t.Fatal("the store refused nothing: the test did not test a refusal")
			}
			evs, err := sq.Events(context.Background(), acc.TurnID, 0, 0)
			if err != nil {
				t.Fatal(err)
			}
			stored := map[int64]bool{}
			for _, e := range evs {
				stored[e.Seq] = true
			}
			if seq := st.refusedSeq(); stored[seq] == again {
				t.Errorf("event %d (llm_finished) stored: %v; events stored: %d", seq, stored[seq], len(evs))
			}
			log := logged.String()
			say := "the turn's suspension stored the events the store refused as it ran"
			if again {
				say = "the turn was suspended before the store took the events it refused: they are lost"
			}
			if !strings.Contains(log, say) {
				t.Errorf("the log does not say %q:\n%s", say, log)
			}
		})
	}
}
