package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/store"
)

func TestHub(t *testing.T) {
	h := newHub()
	a, stored, pending := h.subscribe()
	if stored != 0 || len(pending) != 0 {
		t.Fatalf("stored %d, %d pending", stored, len(pending))
	}
	for i := 1; i <= subBuffer; i++ {
		h.publish(frame{seq: int64(i)})
	}
	h.storedUpTo(subBuffer - 2) // the store is two events behind
	b, stored, pending := h.subscribe()
	if stored != subBuffer-2 || len(pending) != 2 || pending[0].seq != subBuffer-1 || pending[1].seq != subBuffer {
		t.Fatalf("stored %d, pending %v", stored, pending)
	}
	h.publish(frame{seq: subBuffer + 1}) // a's buffer is full: a is cut loose
	fs, open := a.take()
	if len(fs) != subBuffer || open || !h.isLagged(a) {
		t.Fatalf("a got %d, open %v, lagged %v", len(fs), open, h.isLagged(a))
	}
	if fs, open := b.take(); len(fs) != 1 || fs[0].seq != subBuffer+1 || !open {
		t.Fatalf("b got %v, open %v", fs, open)
	}
	if h.behind() != 3 {
		t.Fatalf("%d pending, want 3", h.behind())
	}
	h.end()
	if fs, open := b.take(); len(fs) != 0 || open || h.isLagged(b) {
		t.Fatal("end did not close b, or called it lagged")
	}
	h.unsubscribe(b) // after end: no double close
	s, stored, pending := h.subscribe()
	if s != nil || stored != subBuffer-2 || len(pending) != 3 {
		t.Fatalf("after end: sub %v, stored %d, %d pending; want none, and what the store lacks", s, stored, len(pending))
	}
	h.storedUpTo(subBuffer + 1)
	if _, _, pending := h.subscribe(); len(pending) != 0 {
		t.Fatalf("%d pending once stored", len(pending))
	}
}

// stalledWriter is a ResponseWriter whose writes wait until it is
// released, like a client that stopped reading.
type stalledWriter struct {
	*httptest.ResponseRecorder
	release chan struct{}
	mu      sync.Mutex
	writes  int
}

// Write lets the first write (the stream's opening) through and holds the
// others until release.
func (w *stalledWriter) Write(b []byte) (int, error) {
	w.mu.Lock()
	w.writes++
	first := w.writes == 1
	w.mu.Unlock()
	if !first {
		<-w.release
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ResponseRecorder.Write(b)
}

func (w *stalledWriter) Flush() {}

// TestSlowFollowerCatchesUpFromTheStore holds a follower's writes while
// the turn emits more than its buffer: it is cut loose, and must still get
// every event exactly once, in order, from the store.
func TestSlowFollowerCatchesUpFromTheStore(t *testing.T) {
	st := store.NewMemory()
	defer st.Close()
	s, err := New(Config{Agent: nopRunner{}, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.BeginTurn(context.Background(), store.TurnStart{TurnID: "t1", Input: "x", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	lt := &liveTurn{id: "t1", hub: newHub(), done: make(chan struct{}), cancel: func(error) {}}
	em := event.NewEmitter("t1", &turnSink{s: s, lt: lt})
	em.Emit(&event.TurnStarted{Input: "x"})

	w := &stalledWriter{ResponseRecorder: httptest.NewRecorder(), release: make(chan struct{})}
	r := httptest.NewRequest("GET", "/v1/turns/t1/events", nil)
	ended := make(chan streamEnd, 1)
	go func() { ended <- s.stream(w, r, lt, 0, nil) }()
	// Wait until the follower has subscribed (it then blocks writing).
	for {
		lt.hub.mu.Lock()
		n := len(lt.hub.subs)
		lt.hub.mu.Unlock()
		if n == 1 {
			break
		}
		time.Sleep(time.Millisecond)
	}

	const n = 3 * subBuffer
	for i := range n {
		em.Emit(&event.LLMDelta{Text: strconv.Itoa(i)})
		if i == 2*subBuffer {
			close(w.release) // the follower reads again, mid-turn
		}
	}
	em.Emit(&event.TurnFinished{Status: budget.StatusCompleted, StopReason: budget.Answered})
	lt.hub.end()
	close(lt.done)
	if e := <-ended; e != endFinished {
		t.Fatalf("stream ended %d", e)
	}
	sc := bufio.NewScanner(bytes.NewReader(w.Body.Bytes()))
	want := int64(1)
	for sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
			if id != strconv.FormatInt(want, 10) {
				t.Fatalf("event id %s, want %d", id, want)
			}
			want++
		}
	}
	if want != n+3 {
		t.Fatalf("got %d events, want %d", want-1, n+2)
	}
	if lt.hub.lags == 0 {
		t.Fatal("the follower was never cut loose: the test did not test catching up")
	}
}

type nopRunner struct{}

func (nopRunner) Run(context.Context, agent.Input, ...event.Sink) *agent.Result { return nil }

var _ http.Flusher = (*stalledWriter)(nil)

// laggingStore commits nothing until told (commit), as a queue that is
// behind, but refuses the event refuse for good at once, ahead of the
// events queued before it.
type laggingStore struct {
	store.Store
	refuse  int64
	waiting []func(error)
}

func (s *laggingStore) QueueEvent(e event.Event, committed func(error)) {
	if e.Seq == s.refuse {
		committed(errors.New("database or disk is full"))
		return
	}
	s.waiting = append(s.waiting, committed)
}

func (s *laggingStore) commit() {
	for _, c := range s.waiting {
		c(nil)
	}
	s.waiting = nil
}

// TestARefusalSaysNothingOfTheEventsBefore: an event the store refused
// does not make the hub take the events before it for stored; only their
// own commits do, and none past the refused one.
func TestARefusalSaysNothingOfTheEventsBefore(t *testing.T) {
	st := &laggingStore{Store: store.NewMemory(), refuse: 3}
	defer st.Close()
	s, err := New(Config{Agent: nopRunner{}, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	lt := &liveTurn{id: "t1", hub: newHub(), done: make(chan struct{}), cancel: func(error) {}}
	em := event.NewEmitter("t1", &turnSink{s: s, lt: lt})
	em.Emit(&event.TurnStarted{Input: "x"})
	for i := range 3 {
		em.Emit(&event.LLMDelta{Text: strconv.Itoa(i)}) // seqs 2, 3 (refused), 4
	}
	if _, stored, pending := lt.hub.subscribe(); stored != 0 || len(pending) != 4 {
		t.Fatalf("before any commit: stored %d, %d pending; want 0 and 4", stored, len(pending))
	}
	st.commit() // 1, 2 and 4
	if _, stored, pending := lt.hub.subscribe(); stored != 2 || len(pending) != 2 || pending[0].seq != 3 {
		t.Fatalf("after the commits: stored %d, pending %v; want 2, and 3 and 4", stored, pending)
	}
}
