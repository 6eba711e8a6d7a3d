package postgres_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
)

// frozen freezes pg (testenv.PostgresServer.Freeze) and returns the thaw,
// which does nothing the second time; the test's cleanup thaws it anyway.
func frozen(t *testing.T, pg *testenv.PostgresServer) (thaw func()) {
	t.Helper()
	var once sync.Once
	thaw = func() { once.Do(pg.Thaw) }
	pg.Freeze()
	t.Cleanup(thaw)
	return thaw
}

// TestAHungDatabaseRefusesANewTurn: a database that takes the statements
// and does not answer (SIGSTOP) refuses a new turn once it has answered
// nothing for hungAfter, as a database that is away does
// (store.ErrUnavailable: 503 store_unavailable), rather than holding its
// client until it is back.
func TestAHungDatabaseRefusesANewTurn(t *testing.T) {
	pg := testenv.StartPostgres(t)
	defer postgres.HungAfter(500 * time.Millisecond)()
	st := open(t, pg.Database(), postgres.Options{})
	defer st.Close()
	thaw := frozen(t, pg)
	start := time.Now()
	err := st.BeginTurn(context.Background(), store.TurnStart{TurnID: "t1", Input: "go"})
	took := time.Since(start)
	thaw()
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "answered nothing for 500ms") {
		t.Fatalf("BeginTurn on a hung database: %v", err)
	}
	if took > 5*time.Second {
		t.Errorf("BeginTurn waited %s for a hung database (bound 500ms)", took)
	}
	// Back, the database takes the turn.
	if err := st.BeginTurn(context.Background(), store.TurnStart{TurnID: "t2", Input: "go"}); err != nil {
		t.Fatal(err)
	}
}

// TestReadsOfAHungDatabaseAreUnavailable: every read of a database that
// hangs is given up once the database has answered nothing for hungAfter
// (store.ErrUnavailable: 503 store_unavailable), and reads again once it
// goes on. Before 2026-11-28 each waited as long as the hang (BeginTurn
// alone was bounded).
func TestReadsOfAHungDatabaseAreUnavailable(t *testing.T) {
	pg := testenv.StartPostgres(t)
	defer postgres.HungAfter(500 * time.Millisecond)()
	st := open(t, pg.Database(), postgres.Options{})
	defer st.Close()
	ctx := context.Background()
	if err := st.BeginTurn(ctx, store.TurnStart{TurnID: "t1", SessionID: "s1", Input: "go"}); err != nil {
		t.Fatal(err)
	}
	// Each read gives up by itself after 10 s, so that without the bound
	// the test fails rather than waits for a thaw that comes after it.
	var ctx10 context.Context
	reads := []struct {
		name string
		read func() error
	}{
		{"Turn", func() error { _, err := st.Turn(ctx10, "t1"); return err }},
		{"TurnWithoutResults", func() error { _, err := st.TurnWithoutResults(ctx10, "t1"); return err }},
		{"Turns", func() error { _, err := st.Turns(ctx10, store.Filter{}); return err }},
		{"Events", func() error { _, err := st.Events(ctx10, "t1", 0, 0); return err }},
		{"History", func() error { _, err := st.History(ctx10, "s1"); return err }},
		{"Session", func() error { _, err := st.Session(ctx10, "s1"); return err }},
		{"Sessions", func() error { _, err := st.Sessions(ctx10, 0); return err }},
		{"Approvals", func() error { _, err := st.Approvals(ctx10, "t1"); return err }},
		{"ToolStats", func() error { _, err := st.ToolStats(ctx10, store.StatsFilter{}); return err }},
		{"ListDeliveries", func() error { _, err := st.ListDeliveries(ctx10, store.DeliveryFilter{}); return err }},
		{"RequestCancel", func() error { return st.RequestCancel(ctx10, "t1") }},
	}
	thaw := frozen(t, pg)
	for _, r := range reads {
		var cancel context.CancelFunc
		ctx10, cancel = context.WithTimeout(ctx, 10*time.Second)
		start := time.Now()
		err := r.read()
		cancel()
		took := time.Since(start)
		if !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("%s of a hung database: %v", r.name, err)
		}
		if took > 5*time.Second {
			t.Errorf("%s waited %s for a hung database (bound 500ms)", r.name, took)
		}
	}
	thaw()
	ctx10 = ctx
	for _, r := range reads {
		if err := r.read(); err != nil {
			t.Errorf("%s once the database goes on: %v", r.name, err)
		}
	}
}

// TestASlowReadOfALiveDatabaseIsWaitedFor: a read that waits on a
// database that answers (here for a lock another connection holds 3 s;
// a conversation of 50 MB would do the same) is not cut by the bound on a
// database that hangs, which is a bound on the database's silence, not on
// the read: its probes are answered meanwhile.
func TestASlowReadOfALiveDatabaseIsWaitedFor(t *testing.T) {
	pg := testenv.StartPostgres(t)
	defer postgres.HungAfter(500 * time.Millisecond)()
	dsn := pg.Database()
	st := open(t, dsn, postgres.Options{})
	defer st.Close()
	ctx := context.Background()
	if err := st.BeginTurn(ctx, store.TurnStart{TurnID: "t1", Input: "go"}); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `LOCK TABLE turns IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	held := 3 * time.Second
	released := make(chan struct{})
	time.AfterFunc(held, func() {
		defer close(released)
		_ = tx.Rollback(ctx)
	})
	defer func() { <-released }()
	start := time.Now()
	rec, err := st.Turn(ctx, "t1")
	took := time.Since(start)
	if err != nil {
		t.Fatalf("a read that waited %s for a lock on a live database: %v", took, err)
	}
	if rec.TurnID != "t1" || took < held-100*time.Millisecond {
		t.Errorf("read %q after %s; want t1 after the lock's %s", rec.TurnID, took, held)
	}
}

// TestAnUnansweredBeginIsEnded: the database hangs as BeginTurn's COMMIT
// is sent; the turn is refused (store.ErrUnavailable) but stored once the
// database goes on. Nobody runs it: the store ends it, interrupted, at its
// next heartbeat, and its session takes the next turn. Before 2026-11-28
// it stayed running, its session busy (409 session_busy), until its store
// closed.
func TestAnUnansweredBeginIsEnded(t *testing.T) {
	for _, held := range []bool{false, true} {
		name := map[bool]string{false: "thawed whole", true: "its backend held"}[held]
		t.Run(name, func(t *testing.T) { unansweredBegin(t, held) })
	}
}

// unansweredBegin is TestAnUnansweredBeginIsEnded; held keeps the backend
// of the BeginTurn's transaction stopped, its COMMIT unread, for 3 s after
// the rest of the database answers again (a stalled process): the store
// must not take the turn for unstored meanwhile, or the COMMIT read
// afterwards would leave it running for good. (It does not: the heartbeat
// that looks waits for that transaction, which holds the store's owner
// row.)
func unansweredBegin(t *testing.T, held bool) {
	pg := testenv.StartPostgres(t)
	// Long enough that the COMMIT is sent, however slow freezing the
	// database is, before the store gives the BeginTurn up.
	defer postgres.HungAfter(2 * time.Second)()
	st := open(t, pg.Database(), postgres.Options{Heartbeat: 200 * time.Millisecond})
	defer st.Close()
	ctx := context.Background()
	var thaw func()
	backend := 0
	postgres.BeforeBeginCommit(func(pid int) { thaw, backend = frozen(t, pg), pid })
	err := st.BeginTurn(ctx, store.TurnStart{TurnID: "t1", SessionID: "s1", Input: "go"})
	postgres.BeforeBeginCommit(nil)
	if thaw == nil {
		t.Fatalf("BeginTurn did not reach its COMMIT: %v", err)
	}
	if held {
		// The heartbeats (every 200ms) answer, and look at the turn,
		// while its transaction is held: for 3 s the store must still
		// count it to end.
		pg.ThawBut(backend)
		if wait.Until(3*time.Second, func() bool { return st.Unbegun() == 0 }) {
			t.Error("the store forgot the turn while its BeginTurn's COMMIT was unread")
		}
	}
	thaw()
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("BeginTurn whose COMMIT was not answered: %v", err)
	}
	var rec *event.Turn
	ok := wait.Until(10*time.Second, func() bool {
		rec, err = st.Turn(ctx, "t1")
		return err == nil && rec.Status != budget.StatusRunning
	})
	if !ok {
		t.Fatalf("the turn refused as it began, 10 s after the database went on: %+v, %v", rec, err)
	}
	if rec.Status != budget.StatusInterrupted || !strings.Contains(rec.Message, "before it began") {
		t.Errorf("the turn refused as it began ended %s: %q", rec.Status, rec.Message)
	}
	if err := st.BeginTurn(ctx, store.TurnStart{TurnID: "t2", SessionID: "s1", Input: "again"}); err != nil {
		t.Errorf("the session's next turn: %v", err)
	}
	if n := st.Unbegun(); n != 0 {
		t.Errorf("turns left to end: %d", n)
	}
}
