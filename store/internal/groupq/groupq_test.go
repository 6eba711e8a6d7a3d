package groupq

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	errDown = errors.New("the database is away")
	errBad  = errors.New("a bad event")
)

// fakeDB commits groups: it fails the next `down` attempts transiently,
// refuses any group holding a seq in bad, and keeps what it stored.
type fakeDB struct {
	mu       sync.Mutex
	down     int
	bad      map[int64]bool
	stored   []int64
	attempts []int // sizes of the groups attempted
	release  chan struct{}
	// entered, when not nil, is sent to as a commit begins, if it has
	// room.
	entered chan struct{}
}

func (f *fakeDB) commit(group []*Item) error {
	select {
	case f.entered <- struct{}{}:
	default:
	}
	if f.release != nil {
		<-f.release
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts = append(f.attempts, len(group))
	if f.down > 0 {
		f.down--
		return errDown
	}
	for _, it := range group {
		if f.bad[key(it)] {
			return errBad
		}
	}
	for _, it := range group {
		f.stored = append(f.stored, key(it))
	}
	return nil
}

// key is an event's seq, or the negative of a work's (Do: an int64).
func key(it *Item) int64 {
	if w, ok := it.Work.(int64); ok {
		return -w
	}
	return it.Event.Seq
}

func transient(err error) bool { return errors.Is(err, errDown) }

func ev(seq int64) event.Event {
	return event.Event{Seq: seq, TurnID: "t", Type: event.TypeLLMDelta, Data: &event.LLMDelta{Text: fmt.Sprint(seq)}}
}

// results collects callbacks in the order they come.
type results struct {
	mu   sync.Mutex
	seqs []int64
	errs map[int64]error
	all  sync.WaitGroup
}

func newResults(n int) *results {
	r := &results{errs: map[int64]error{}}
	r.all.Add(n)
	return r
}

func (r *results) cb(seq int64) func(error) {
	return func(err error) {
		r.mu.Lock()
		r.seqs = append(r.seqs, seq)
		if err != nil {
			r.errs[seq] = err
		}
		r.mu.Unlock()
		r.all.Done()
	}
}

func seqs(n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = int64(i + 1)
	}
	return out
}

// TestTransientFailuresAreRetriedWhole: a group whose commit fails while
// the database is away is committed again, whole and in order, until it
// is stored: nothing is lost, every callback says stored, in queue order,
// and the queue says it was behind, then that it caught up.
func TestTransientFailuresAreRetriedWhole(t *testing.T) {
	db := &fakeDB{down: 4, release: make(chan struct{})}
	var states []Status
	var smu sync.Mutex
	q := New(db.commit, Options{Transient: transient, Backoff: time.Millisecond, OnState: func(s Status) {
		smu.Lock()
		states = append(states, s)
		smu.Unlock()
	}})
	defer q.Close()
	r := newResults(10)
	for _, s := range seqs(10) {
		q.Add(ev(s), r.cb(s))
	}
	close(db.release)
	r.all.Wait()
	if len(r.errs) != 0 {
		t.Fatalf("callbacks failed: %v", r.errs)
	}
	if fmt.Sprint(db.stored) != fmt.Sprint(seqs(10)) || fmt.Sprint(r.seqs) != fmt.Sprint(seqs(10)) {
		t.Fatalf("stored %v, called back %v; want 1..10 in order", db.stored, r.seqs)
	}
	// The group the outage met is attempted whole until it is stored.
	for _, n := range db.attempts[:5] {
		if n != db.attempts[0] {
			t.Fatalf("attempts of sizes %v: a retried group was split", db.attempts)
		}
	}
	smu.Lock()
	defer smu.Unlock()
	if len(states) != 2 || !states[0].Behind() || !errors.Is(states[0].Err, errDown) || states[1].Behind() || states[1].Recovered <= 0 {
		t.Fatalf("states %+v: want behind, then caught up", states)
	}
	// A group's callbacks run just before its room is freed: the status
	// catches up a moment after the last one.
	if !wait.Until(5*time.Second, func() bool { st := q.Status(); return !st.Behind() && st.Waiting == 0 && st.Bytes == 0 }) {
		t.Errorf("status after: %+v", q.Status())
	}
}

// TestABadEventFailsAlone: a group that fails for good is committed one
// event at a time: only the bad event's callback fails.
func TestABadEventFailsAlone(t *testing.T) {
	db := &fakeDB{bad: map[int64]bool{3: true}, release: make(chan struct{})}
	q := New(db.commit, Options{Transient: transient})
	defer q.Close()
	r := newResults(5)
	for _, s := range seqs(5) {
		q.Add(ev(s), r.cb(s))
	}
	close(db.release)
	r.all.Wait()
	if len(r.errs) != 1 || !errors.Is(r.errs[3], errBad) {
		t.Fatalf("errors %v: want only 3's", r.errs)
	}
	if fmt.Sprint(db.stored) != "[1 2 4 5]" {
		t.Fatalf("stored %v", db.stored)
	}
}

// TestBoundedWhileDown: while commits fail, Add waits once MaxQueue events
// (or MaxBytes) are waiting — memory stays bounded — and goes on when the
// database is back.
func TestBoundedWhileDown(t *testing.T) {
	db := &fakeDB{down: 1 << 30}
	q := New(db.commit, Options{Transient: transient, MaxQueue: 8, Backoff: time.Millisecond, MaxBackoff: time.Millisecond})
	defer q.Close()
	r := newResults(20)
	added := make(chan int64, 20)
	go func() {
		for _, s := range seqs(20) {
			q.Add(ev(s), r.cb(s))
			added <- s
		}
	}()
	// Eight are taken, the ninth waits for room.
	deadline := time.After(10 * time.Second)
	for got := 0; got < 8; got++ {
		select {
		case <-added:
		case <-deadline:
			t.Fatal("the first 8 were not added")
		}
	}
	select {
	case s := <-added:
		t.Fatalf("event %d was added past the bound while the database was down", s)
	case <-time.After(100 * time.Millisecond):
	}
	if st := q.Status(); st.Waiting != 8 || !st.Behind() {
		t.Fatalf("status while down: %+v", st)
	}
	db.mu.Lock()
	db.down = 0
	db.mu.Unlock()
	r.all.Wait()
	if len(r.errs) != 0 || len(db.stored) != 20 {
		t.Fatalf("%d stored, errors %v", len(db.stored), r.errs)
	}
}

// TestMaxBytes: the bound in bytes holds too.
func TestMaxBytes(t *testing.T) {
	db := &fakeDB{down: 1 << 30}
	q := New(db.commit, Options{Transient: transient, MaxBytes: 1, Backoff: time.Millisecond, MaxBackoff: time.Millisecond,
		CloseTimeout: 10 * time.Millisecond})
	r := newResults(2)
	q.Add(ev(1), r.cb(1))
	second := make(chan struct{})
	go func() {
		q.Add(ev(2), r.cb(2))
		close(second)
	}()
	select {
	case <-second:
		t.Fatal("a second event was added past MaxBytes")
	case <-time.After(100 * time.Millisecond):
	}
	q.Close()
	<-second
	r.all.Wait()
	if !errors.Is(r.errs[1], store.ErrClosed) || !errors.Is(r.errs[2], store.ErrClosed) {
		t.Fatalf("errors %v: want both closed", r.errs)
	}
}

// TestCloseGivesUp: Close goes on committing while commits fail for at
// most CloseTimeout; what is left then fails with ErrClosed, saying why.
func TestCloseGivesUp(t *testing.T) {
	db := &fakeDB{down: 1 << 30}
	q := New(db.commit, Options{Transient: transient, Backoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond, CloseTimeout: 50 * time.Millisecond})
	r := newResults(3)
	for _, s := range seqs(3) {
		q.Add(ev(s), r.cb(s))
	}
	start := time.Now()
	q.Close()
	took := time.Since(start)
	r.all.Wait()
	if took > 5*time.Second {
		t.Errorf("Close took %v", took)
	}
	for _, s := range seqs(3) {
		if err := r.errs[s]; !errors.Is(err, store.ErrClosed) || !errors.Is(err, errDown) {
			t.Errorf("event %d: %v; want ErrClosed wrapping the failure", s, err)
		}
	}
	q.Add(ev(4), func(err error) {
		if !errors.Is(err, store.ErrClosed) {
			t.Errorf("an event after Close: %v", err)
		}
	})
}

// TestFlushWaitsForTheDatabase: Flush returns once what was queued before
// it is stored, after the database came back.
func TestFlushWaitsForTheDatabase(t *testing.T) {
	db := &fakeDB{down: 3}
	q := New(db.commit, Options{Transient: transient, Backoff: time.Millisecond})
	defer q.Close()
	q.Add(ev(1), nil)
	if err := q.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(db.stored) != "[1]" {
		t.Fatalf("stored %v after Flush", db.stored)
	}
}

// TestAStuckCommitIsBehind: a commit that neither ends nor fails (a lock
// held on the table) puts the queue behind once it has waited Stuck, and
// not before; once it commits, the queue has caught up.
func TestAStuckCommitIsBehind(t *testing.T) {
	db := &fakeDB{release: make(chan struct{})}
	q := New(db.commit, Options{Transient: transient, Stuck: 500 * time.Millisecond})
	defer q.Close()
	r := newResults(1)
	q.Add(ev(1), r.cb(1))
	if st := q.Status(); st.Behind() {
		t.Fatalf("behind at once: %+v", st)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !q.Status().Behind() {
		if time.Now().After(deadline) {
			t.Fatalf("a commit stuck for 10s is not behind: %+v", q.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
	st := q.Status()
	if st.Waiting != 1 || st.Err == nil || !strings.Contains(st.Err.Error(), "has waited") {
		t.Errorf("stuck status %+v", st)
	}
	if b := q.Backlog(); !b.Behind() || b.Events != 1 || b.Err == "" {
		t.Errorf("backlog %+v", b)
	}
	close(db.release)
	r.all.Wait()
	if st := q.Status(); st.Behind() || st.Waiting != 0 {
		t.Errorf("after the commit: %+v", st)
	}
}

// TestBacklogShowsNoStoreError: the backlog /healthz shows says that
// writes fail, not the store's error, which names its database, host and
// user (the log has it).
func TestBacklogShowsNoStoreError(t *testing.T) {
	secret := errors.New("failed to connect to `user=tbadmin database=prod`: 10.0.0.7:5432: connection refused")
	release := make(chan struct{})
	var once sync.Once
	q := New(func([]*Item) error {
		<-release
		return secret
	}, Options{Transient: func(error) bool { return true }, Backoff: time.Millisecond, CloseTimeout: 10 * time.Millisecond})
	q.Add(ev(1), nil)
	once.Do(func() { close(release) })
	deadline := time.Now().Add(10 * time.Second)
	for !q.Backlog().Behind() {
		if time.Now().After(deadline) {
			t.Fatal("never behind")
		}
		time.Sleep(time.Millisecond)
	}
	if b := q.Backlog(); strings.Contains(b.Err, "tbadmin") || strings.Contains(b.Err, "10.0.0.7") || b.Err == "" {
		t.Errorf("backlog error %q", b.Err)
	}
	if st := q.Status(); !errors.Is(st.Err, secret) {
		t.Errorf("the status (for the log) lost the error: %v", st.Err)
	}
	q.Close()
}

// TestFlushesDoNotSplitGroups: what is queued around Flush markers is
// committed in one group, and each Flush returns once what was queued
// before it is stored. (A marker used to end its group: 10,000 turns that
// ended at once, each flushing, committed one event a transaction.)
func TestFlushesDoNotSplitGroups(t *testing.T) {
	db := &fakeDB{release: make(chan struct{}), entered: make(chan struct{}, 1)}
	q := New(db.commit, Options{})
	defer q.Close()
	q.Add(ev(1), nil)
	<-db.entered // the writer commits it, and waits for release
	flushed := make(chan int64, 2)
	for _, seq := range []int64{2, 3} {
		q.Add(ev(seq), nil)
		go func() {
			if err := q.Flush(context.Background()); err != nil {
				t.Error(err)
			}
			db.mu.Lock()
			flushed <- int64(len(db.stored))
			db.mu.Unlock()
		}()
		want := int(seq) + 1 // the events so far and this flush
		if seq == 3 {
			want++ // and the first flush
		}
		if !wait.Until(5*time.Second, func() bool { return q.Status().Waiting == want }) {
			t.Fatalf("flush after %d not queued: %+v", seq, q.Status())
		}
	}
	q.Add(ev(4), nil)
	close(db.release)
	for range 2 {
		if n := <-flushed; n < 3 {
			t.Errorf("a Flush returned with %d events stored, want at least the 3 queued before it", n)
		}
	}
	if err := q.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	db.mu.Lock()
	defer db.mu.Unlock()
	if fmt.Sprint(db.attempts) != "[1 3]" || fmt.Sprint(db.stored) != "[1 2 3 4]" {
		t.Fatalf("groups of %v storing %v: want [1 3], the flushes inside the second group, storing 1..4", db.attempts, db.stored)
	}
}

// TestDoIsCommittedInItsPlace: a store's own write (Do) is handed to the
// commit in its place among the events, in their group; one that fails
// for good fails alone, as an event does; after Close it fails with
// store.ErrClosed.
func TestDoIsCommittedInItsPlace(t *testing.T) {
	db := &fakeDB{release: make(chan struct{}), entered: make(chan struct{}, 1), bad: map[int64]bool{-200: true}}
	q := New(db.commit, Options{})
	r := newResults(6)
	q.Add(ev(1), r.cb(1))
	<-db.entered
	q.Add(ev(2), r.cb(2))
	q.Do(int64(100), r.cb(-100))
	q.Add(ev(3), r.cb(3))
	close(db.release)
	if err := q.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	db.mu.Lock()
	if fmt.Sprint(db.attempts) != "[1 3]" || fmt.Sprint(db.stored) != "[1 2 -100 3]" {
		t.Fatalf("groups of %v storing %v: want [1 3] storing [1 2 -100 3]", db.attempts, db.stored)
	}
	db.mu.Unlock()
	q.Add(ev(4), r.cb(4))
	q.Do(int64(200), r.cb(-200))
	q.Close()
	q.Do(int64(300), func(err error) {
		if !errors.Is(err, store.ErrClosed) {
			t.Errorf("Do after Close: %v, want store.ErrClosed", err)
		}
	})
	r.all.Wait()
	if fmt.Sprint(r.seqs) != "[1 2 -100 3 4 -200]" {
		t.Errorf("called back %v, want in queue order", r.seqs)
	}
	if len(r.errs) != 1 || !errors.Is(r.errs[-200], errBad) {
		t.Errorf("errors %v: want only the bad work's", r.errs)
	}
}

// TestRoomForABurst: by default the queue holds store.MaxQueued events
// while its database cannot keep up, not 8,192: 10,000 turns stopped at
// one instant queue two or three events and an end each, and with room
// for 8,192 they waited seconds for the disk (issue 29).
func TestRoomForABurst(t *testing.T) {
	db := &fakeDB{down: 1 << 30}
	q := New(db.commit, Options{Transient: transient, Backoff: time.Millisecond, MaxBackoff: time.Millisecond, CloseTimeout: time.Second})
	defer q.Close()
	const burst = 30000 // 10,000 turns' tool_finished, turn_finished and end
	r := newResults(burst)
	added := make(chan struct{})
	go func() {
		defer close(added)
		for _, s := range seqs(burst) {
			q.Add(ev(s), r.cb(s)) // waits for room past the bound
		}
	}()
	select {
	case <-added:
	case <-time.After(10 * time.Second):
		t.Fatalf("Add waited for room with %d events queued, want room for %d", q.Status().Waiting, burst)
	}
	if st := q.Status(); st.Waiting != burst || !st.Behind() || store.MaxQueued < burst {
		t.Fatalf("status while down: %+v (room for %d)", st, store.MaxQueued)
	}
	db.mu.Lock()
	db.down = 0
	db.mu.Unlock()
	r.all.Wait()
	if len(r.errs) != 0 || len(db.stored) != burst {
		t.Fatalf("%d stored, errors %v", len(db.stored), r.errs)
	}
}
