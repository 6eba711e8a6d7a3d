package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/store/storetest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { testenv.StopPostgres() }))
}

func open(t testing.TB, dsn string, o postgres.Options) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(context.Background(), dsn, o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// sql runs statements on the test database directly.
func sql(t testing.TB, dsn string, query string, args ...any) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), query, args...); err != nil {
		t.Fatal(err)
	}
}

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, testenv.Postgres(t), postgres.Options{}) })
}

func TestCrash(t *testing.T) {
	storetest.RunCrash(t, func(t *testing.T) (store.Store, func(func(store.Ending)) store.Store) {
		dsn := testenv.Postgres(t)
		s := open(t, dsn, postgres.Options{Heartbeat: 100 * time.Millisecond})
		return s, func(ended func(store.Ending)) store.Store {
			s.Crash()
			return open(t, dsn, postgres.Options{Heartbeat: 100 * time.Millisecond, Ended: ended})
		}
	}, "stopped sending heartbeats")
}

// TestMigrationsRace: gateways starting at once on a new database migrate
// it once, and a database from a newer timebox is refused.
func TestMigrationsRace(t *testing.T) {
	dsn := testenv.Postgres(t)
	const n = 6
	stores := make([]*postgres.Store, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { stores[i], errs[i] = postgres.Open(context.Background(), dsn, postgres.Options{}) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("gateway %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var versions, owners int
	if err := conn.QueryRow(context.Background(), `SELECT COUNT(*), (SELECT COUNT(*) FROM owners) FROM timebox_schema`).Scan(&versions, &owners); err != nil {
		t.Fatal(err)
	}
	if versions != postgres.SchemaVersion || owners != n {
		t.Fatalf("%d schema versions recorded (want %d), %d owners (want %d)", versions, postgres.SchemaVersion, owners, n)
	}
	if _, err := conn.Exec(context.Background(), `INSERT INTO timebox_schema (version) VALUES ($1)`, postgres.SchemaVersion+1); err != nil {
		t.Fatal(err)
	}
	if s, err := postgres.Open(context.Background(), dsn, postgres.Options{}); err == nil || !strings.Contains(err.Error(), "newer than this timebox") {
		if s != nil {
			s.Close()
		}
		t.Fatalf("newer schema: %v", err)
	}
}

// TestGoneOwnerInterruptedExactlyOnce: gateways racing to mark a dead
// gateway's turns interrupted do it once between them.
func TestGoneOwnerInterruptedExactlyOnce(t *testing.T) {
	dsn := testenv.Postgres(t)
	a := open(t, dsn, postgres.Options{Heartbeat: time.Hour})
	for i := range 3 {
		if _, _, err := storetest.WriteRunningTurn(a, fmt.Sprintf("t%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	a.Crash()
	// Heartbeats of an hour: only the explicit Recover calls below look.
	const racers = 4
	var (
		stores []*postgres.Store
		mu     sync.Mutex
		got    []string
		wg     sync.WaitGroup
	)
	for range racers {
		s := open(t, dsn, postgres.Options{Heartbeat: time.Hour})
		defer s.Close()
		stores = append(stores, s)
	}
	// a has been silent for a day now.
	sql(t, dsn, `UPDATE owners SET heartbeat_at = now() - interval '1 day' WHERE owner_id = $1`, a.Owner())
	for _, s := range stores {
		s.SeenFor(48 * time.Hour) // judges that have seen the database all along
		for range 3 {
			wg.Go(func() {
				ids, err := s.Recover()
				if err != nil {
					t.Error(err)
				}
				mu.Lock()
				got = append(got, ids...)
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	if len(got) != 3 {
		t.Fatalf("the racers marked %v; want each of t0, t1, t2 once", got)
	}
	for i := range 3 {
		id := fmt.Sprintf("t%d", i)
		evs, err := stores[0].Events(context.Background(), id, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		finished := 0
		for _, e := range evs {
			if e.Type == event.TypeTurnFinished {
				finished++
			}
		}
		rec, _ := stores[0].Turn(context.Background(), id)
		if finished != 1 || rec.Status != budget.StatusInterrupted || !strings.Contains(rec.Message, "stopped sending heartbeats") {
			t.Fatalf("%s: %d turn_finished, %s: %s", id, finished, rec.Status, rec.Message)
		}
	}
}

// TestALiveOwnerKeepsItsTurns: a gateway that heartbeats keeps its turns
// however long they run, whoever looks.
func TestALiveOwnerKeepsItsTurns(t *testing.T) {
	dsn := testenv.Postgres(t)
	a := open(t, dsn, postgres.Options{Heartbeat: 50 * time.Millisecond})
	defer a.Close()
	if _, _, err := storetest.WriteRunningTurn(a, "t1"); err != nil {
		t.Fatal(err)
	}
	b := open(t, dsn, postgres.Options{Heartbeat: 50 * time.Millisecond})
	time.Sleep(400 * time.Millisecond) // eight of a's heartbeats, and of b's looks
	if ids, err := b.Recover(); err != nil || len(ids) != 0 {
		t.Fatalf("a live gateway's turn marked: %v %v", ids, err)
	}
	if rec, err := b.Turn(context.Background(), "t1"); err != nil || rec.Status != budget.StatusRunning {
		t.Fatalf("%v %v", rec.Status, err)
	}
	b.Close()
	// A clean Close marks the closing store's own running turns.
	a.Close()
	c := open(t, dsn, postgres.Options{})
	defer c.Close()
	rec, err := c.Turn(context.Background(), "t1")
	if err != nil || rec.Status != budget.StatusInterrupted || !strings.Contains(rec.Message, "the store was closed") {
		t.Fatalf("%+v %v", rec, err)
	}
}

// TestTakenForGone: a gateway that paused past its heartbeat window finds
// its turn interrupted by another: its later events and its record are
// refused (the interruption is the turn's end, once), its turn is told to
// stop, and it can begin new turns.
func TestTakenForGone(t *testing.T) {
	dsn := testenv.Postgres(t)
	a := open(t, dsn, postgres.Options{Heartbeat: time.Hour, Poll: 20 * time.Millisecond})
	defer a.Close()
	b := open(t, dsn, postgres.Options{Heartbeat: time.Hour})
	defer b.Close()
	stop, unwatch := a.WatchCancel("t1")
	defer unwatch()
	if _, _, err := storetest.WriteRunningTurn(a, "t1"); err != nil {
		t.Fatal(err)
	}
	sql(t, dsn, `UPDATE owners SET heartbeat_at = now() - interval '1 day' WHERE owner_id = $1`, a.Owner())
	b.SeenFor(48 * time.Hour)
	if ids, err := b.Recover(); err != nil || len(ids) != 1 {
		t.Fatalf("Recover: %v %v", ids, err)
	}
	select {
	case <-stop:
	case <-time.After(10 * time.Second):
		t.Fatal("the turn was not told that another gateway ended it")
	}
	ctx := context.Background()
	evs, _ := a.Events(ctx, "t1", 0, 0)
	last := evs[len(evs)-1].Seq
	err := a.AppendEvent(ctx, event.Event{Seq: last + 1, TurnID: "t1", Type: event.TypeLLMDelta, At: time.Now(), Data: &event.LLMDelta{Text: "late"}})
	if !errors.Is(err, store.ErrNotRunning) {
		t.Fatalf("an event after the interruption: %v", err)
	}
	err = a.FinishTurn(ctx, &event.Turn{TurnID: "t1", Status: budget.StatusCompleted, StopReason: budget.Answered}, nil)
	if !errors.Is(err, store.ErrNotRunning) {
		t.Fatalf("the record after the interruption: %v", err)
	}
	kept := len(evs) - 2 // without the recovery's tool_finished and turn_finished
	storetest.CheckInterrupted(t, a, "t1", kept, kept, "stopped sending heartbeats")
	if err := a.BeginTurn(ctx, store.TurnStart{TurnID: "t2", Input: "again"}); err != nil {
		t.Fatal(err)
	}
	if ids, err := b.Recover(); err != nil || len(ids) != 0 {
		t.Fatalf("the new turn of the gateway that came back was taken: %v %v", ids, err)
	}
}

// TestWatchAcrossStores: a watcher on one gateway is woken by the commits
// of another through LISTEN/NOTIFY (the poll is an hour), and, with every
// notification lost, by its poll: it reads every event either way.
func TestWatchAcrossStores(t *testing.T) {
	for _, lost := range []bool{false, true} {
		t.Run(fmt.Sprintf("notifications_lost=%v", lost), func(t *testing.T) {
			dsn := testenv.Postgres(t)
			a := open(t, dsn, postgres.Options{})
			defer a.Close()
			poll := time.Hour
			if lost {
				poll = 20 * time.Millisecond
			}
			b := open(t, dsn, postgres.Options{Poll: poll})
			defer b.Close()
			b.DropNotifications(lost)
			wake, stop := b.Watch("t1")
			defer stop()
			ctx := context.Background()
			if err := a.BeginTurn(ctx, store.TurnStart{TurnID: "t1", Input: "x"}); err != nil {
				t.Fatal(err)
			}
			const n = 200
			go func() {
				for seq := int64(1); seq <= n; seq++ {
					a.QueueEvent(event.Event{Seq: seq, TurnID: "t1", Type: event.TypeLLMDelta, At: time.Now(),
						Data: &event.LLMDelta{Text: fmt.Sprint(seq)}}, nil)
					if seq%20 == 0 {
						time.Sleep(5 * time.Millisecond)
					}
				}
			}()
			var last int64
			deadline := time.After(20 * time.Second)
			for last < n {
				select {
				case <-wake:
				case <-deadline:
					t.Fatalf("read %d of %d events", last, n)
				}
				evs, err := b.Events(ctx, "t1", last, 0)
				if err != nil {
					t.Fatal(err)
				}
				for _, e := range evs {
					if e.Seq != last+1 || e.Data.(*event.LLMDelta).Text != fmt.Sprint(e.Seq) {
						t.Fatalf("event %+v after %d", e, last)
					}
					last = e.Seq
				}
			}
		})
	}
}

// TestCancelAcrossStores: a cancel request made through one gateway
// reaches the gateway running the turn, by notification, or by its poll
// when the notification is lost.
func TestCancelAcrossStores(t *testing.T) {
	for _, lost := range []bool{false, true} {
		t.Run(fmt.Sprintf("notifications_lost=%v", lost), func(t *testing.T) {
			dsn := testenv.Postgres(t)
			poll := time.Hour
			if lost {
				poll = 20 * time.Millisecond
			}
			a := open(t, dsn, postgres.Options{Poll: poll})
			defer a.Close()
			a.DropNotifications(lost)
			b := open(t, dsn, postgres.Options{})
			defer b.Close()
			ctx := context.Background()
			cancelled, stop := a.WatchCancel("t1")
			defer stop()
			if err := a.BeginTurn(ctx, store.TurnStart{TurnID: "t1", Input: "x"}); err != nil {
				t.Fatal(err)
			}
			if err := b.RequestCancel(ctx, "t1"); err != nil {
				t.Fatal(err)
			}
			select {
			case <-cancelled:
			case <-time.After(10 * time.Second):
				t.Fatal("the cancel request did not reach the gateway running the turn")
			}
		})
	}
}

// TestSessionBusyAcrossStores: two gateways beginning a turn in one
// session at once: one begins it, the other is told the session is busy.
func TestSessionBusyAcrossStores(t *testing.T) {
	dsn := testenv.Postgres(t)
	a, b := open(t, dsn, postgres.Options{}), open(t, dsn, postgres.Options{})
	defer a.Close()
	defer b.Close()
	for round := range 10 {
		session := fmt.Sprintf("s%d", round)
		errs := make([]error, 2)
		var wg sync.WaitGroup
		for i, s := range []*postgres.Store{a, b} {
			wg.Go(func() {
				errs[i] = s.BeginTurn(context.Background(), store.TurnStart{TurnID: fmt.Sprintf("t%d_%d", round, i), SessionID: session, Input: "x"})
			})
		}
		wg.Wait()
		ok, busy := 0, 0
		for _, err := range errs {
			switch {
			case err == nil:
				ok++
			case errors.Is(err, store.ErrSessionBusy):
				busy++
			default:
				t.Fatal(err)
			}
		}
		if ok != 1 || busy != 1 {
			t.Fatalf("round %d: %v", round, errs)
		}
	}
}

func TestRedact(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://u:sekrit@db:5432/timebox", "postgres://u:xxxxx@db:5432/timebox"},
		{"postgresql://u@db/timebox?sslmode=require", "postgresql://u@db/timebox?sslmode=require"},
		{"postgres://db/timebox?password=sekrit&sslmode=disable", "postgres://db/timebox?password=xxxxx&sslmode=disable"},
		{"postgres://u:se%40krit@db/x", "postgres://u:xxxxx@db/x"},
		{"postgres://u:sekrit@db:port/x", "postgres://u:xxxxx@db:port/x"},
		{"postgres://u:pw@h/db?sslpassword=s3cretH", "postgres://u:xxxxx@h/db?sslpassword=xxxxx"},
		{"postgres://h/db?sslmode=disable&SSLPassword=s3cret&pass%77ord=s3cret", "postgres://h/db?sslmode=disable&SSLPassword=xxxxx&pass%77ord=xxxxx"},
		{"postgres://h/db?password=s3c#ret", "postgres://h/db?password=xxxxx"},
		{"postgres://h/db?password=s3c&ret", "postgres://h/db?password=xxxxx&xxxxx"},
		{"postgres://u:s3c?ret@h/db", "postgres://u:xxxxx@h/db"},
		{"postgres://u:12/s3cret@h/db", "postgres://xxxxx@h/db"},
		{"postgres://u:s3c/ret?x@h/db", "postgres://xxxxx"},
		{"postgres://u:12/s3c@h/db?user=a@b&password=s3cret", "postgres://xxxxx@h/db?user=a@b&password=xxxxx"},
		{"postgres://h/db?user=tb@corp&password=s3cret", "postgres://h/db?user=tb@corp&password=xxxxx"},
		{"Postgres://bob:hunter2@db.example/app", "Postgres://bob:xxxxx@db.example/app"},
		{"mysql://bob:hunter2@db.example/app", "mysql://bob:xxxxx@db.example/app"},
		{"host=127.0.0.1 password = s3cretA port=notaport", "host=127.0.0.1 password = xxxxx port=notaport"},
		{`host=127.0.0.1 password='s3c\' retB' port=notaport`, "host=127.0.0.1 password=xxxxx port=notaport"},
		{`host=h password=s3c\ retC dbname=x`, "host=h password=xxxxx dbname=x"},
		{"host=h sslpassword=s3cretD sslkey=k.pem", "host=h sslpassword=xxxxx sslkey=k.pem"},
		{"host=h password= s3cretE", "host=h password= xxxxx"},
		{"host=h password=s3c retF dbname=x", "host=h password=xxxxx xxxxx"},
		{"host=h password='s3c retG", "host=h password=xxxxx"},
		{"host=h user=u password=hunter://5 dbname=app", "host=h user=u password=xxxxx dbname=app"},
		{"./timebox.db", "./timebox.db"},
	} {
		if got := postgres.Redact(c.in); got != c.want {
			t.Errorf("Redact(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestErrorsHideThePassword: a database that cannot be reached, or a URL
// that does not parse, is an error that names the database without its
// password.
func TestErrorsHideThePassword(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, dsn := range []string{
		"postgres://u:sekrit@127.0.0.1:1/x?connect_timeout=2",
		"postgres://u:sekrit@127.0.0.1:1/x?password=sekrit&connect_timeout=2",
		"postgres://u:sekrit@127.0.0.1:notaport/x",
		"postgres://u:sekrit@127.0.0.1:5432/x?sslmode=bogus",
		"postgres://u@127.0.0.1:1/x?sslpassword=sekrit&connect_timeout=2",
		"Postgres://u:sekrit@127.0.0.1:1/x?connect_timeout=2",
		"mysql://u:sekrit@127.0.0.1:1/x",
		"postgres://u:se/krit@127.0.0.1:1/x",
		"host=127.0.0.1 password = sekrit port=notaport",
		`host=127.0.0.1 password='se\' krit' port=notaport`,
		`host=127.0.0.1 password=se\ krit port=notaport`,
		"host=127.0.0.1 password=se krit port=1",
		"host=127.0.0.1 port=1 password='se krit",
		"host=127.0.0.1 port=1 sslpassword=sekrit connect_timeout=2",
	} {
		s, err := postgres.Open(ctx, dsn, postgres.Options{})
		if err == nil {
			s.Close()
			t.Fatalf("%s: opened", dsn)
		}
		if strings.Contains(err.Error(), "sekrit") || strings.Contains(err.Error(), "krit") {
			t.Errorf("the error shows the password: %v", err)
		}
		var pe *pgconn.ParseConfigError
		if errors.As(err, &pe) && strings.Contains(pe.ConnString, "krit") {
			t.Errorf("the error holds the password: %q", pe.ConnString)
		}
	}
}

// TestOpenReadsTheURL: a postgres:// URL is one in any case (pgx reads
// only the lower-case one), and a URL of another scheme is an error that
// says so.
func TestOpenReadsTheURL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, dsn := range []string{"Postgres://u@127.0.0.1:1/x?connect_timeout=2", "POSTGRESQL://u@127.0.0.1:1/x?connect_timeout=2"} {
		_, err := postgres.Open(ctx, dsn, postgres.Options{})
		var ce *pgconn.ConnectError
		if !errors.As(err, &ce) || ce.Config.Host != "127.0.0.1" || ce.Config.Port != 1 || ce.Config.User != "u" {
			t.Errorf("%s: %v, want a failure to connect to 127.0.0.1:1 as u", dsn, err)
		}
	}
	if _, err := postgres.Open(ctx, "mysql://u@127.0.0.1:1/x", postgres.Options{}); err == nil || !strings.Contains(err.Error(), "not in a mysql:// database") {
		t.Errorf("mysql://: %v", err)
	}
}

// TestHeartbeatParam: timebox_heartbeat in the URL sets the heartbeat the
// store registers (and is not given to the server, which would refuse an
// unknown parameter); a bad value is refused.
func TestHeartbeatParam(t *testing.T) {
	dsn := testenv.Postgres(t)
	s := open(t, dsn+"&"+postgres.HeartbeatParam+"=250ms", postgres.Options{})
	defer s.Close()
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var ms int64
	if err := conn.QueryRow(context.Background(), `SELECT heartbeat_ms FROM owners WHERE owner_id = $1`, s.Owner()).Scan(&ms); err != nil || ms != 250 {
		t.Fatalf("heartbeat_ms %d, %v", ms, err)
	}
	for _, v := range []string{"soon", "1ms", "-1s"} {
		if s, err := postgres.Open(context.Background(), dsn+"&"+postgres.HeartbeatParam+"="+v, postgres.Options{}); err == nil || !strings.Contains(err.Error(), postgres.HeartbeatParam) {
			if s != nil {
				s.Close()
			}
			t.Errorf("%s=%s: %v", postgres.HeartbeatParam, v, err)
		}
	}
}

// TestConnectionStringParams: timebox reads the keys of a key=value
// connection string as pgx does, so a password or other quoted value
// holding "timebox_heartbeat=…" or "pool_max_conns" is left as it is,
// and a quoted heartbeat is read without its quotes.
func TestConnectionStringParams(t *testing.T) {
	for _, c := range []struct {
		in, out string
		hb      time.Duration
	}{
		{"host=db password='a timebox_heartbeat=1s' dbname=x", "host=db password='a timebox_heartbeat=1s' dbname=x", 0},
		{`host=db password=a\ timebox_heartbeat=1s dbname=x`, `host=db password=a\ timebox_heartbeat=1s dbname=x`, 0},
		{"host=db timebox_heartbeat='2s' dbname=x", "host=db  dbname=x", 2 * time.Second},
		{"host=db timebox_heartbeat = 3s", "host=db", 3 * time.Second},
		{"timebox_heartbeat=1s host=db timebox_heartbeat=4s", "host=db", 4 * time.Second},
		{"postgres://db/x?timebox_heartbeat=1s&timebox_heartbeat=5s&sslmode=disable", "postgres://db/x?sslmode=disable", 5 * time.Second},
		{"postgres://db/x?sslmode=disable", "postgres://db/x?sslmode=disable", 0},
	} {
		out, hb, err := postgres.TakeHeartbeat(c.in)
		if err != nil || out != c.out || hb != c.hb {
			t.Errorf("takeHeartbeat(%q) = %q, %v, %v; want %q, %v", c.in, out, hb, err, c.out, c.hb)
		}
	}
	if _, _, err := postgres.TakeHeartbeat("host=db timebox_heartbeat='soon'"); err == nil || !strings.Contains(err.Error(), `"soon"`) {
		t.Errorf("a bad quoted heartbeat: %v", err)
	}
	for dsn, want := range map[string]bool{
		"host=db pool_max_conns=3":                true,
		"host=db password='pool_max_conns=3'":     false,
		"host=db password=pool_max_conns":         false,
		"postgres://db/x?pool_max_conns=3":        true,
		"postgres://u:pool_max_conns@db/x?a=b":    false,
		"host=db application_name=pool_max_conns": false,
	} {
		if got := postgres.HasParam(dsn, "pool_max_conns"); got != want {
			t.Errorf("hasParam(%q) = %v, want %v", dsn, got, want)
		}
	}
}

// TestListenReconnects: a gateway whose LISTEN connection is cut opens it
// again and hears the other gateway's commits as before (its poll is an
// hour: only notifications can wake its watcher).
func TestListenReconnects(t *testing.T) {
	dsn := testenv.Postgres(t)
	a := open(t, dsn, postgres.Options{})
	defer a.Close()
	b := open(t, dsn, postgres.Options{Poll: time.Hour})
	defer b.Close()
	ctx := context.Background()
	if err := a.BeginTurn(ctx, store.TurnStart{TurnID: "t1", Input: "x"}); err != nil {
		t.Fatal(err)
	}
	wake, stop := b.Watch("t1")
	defer stop()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var cut int
	if err := conn.QueryRow(ctx, `SELECT COUNT(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE application_name = $1`, "timebox listen "+b.Owner()).Scan(&cut); err != nil || cut != 1 {
		rows, _ := conn.Query(ctx, `SELECT application_name FROM pg_stat_activity`)
		names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
		t.Fatalf("cut %d LISTEN connections of b (want 1): %v; connections: %q", cut, err, names)
	}
	// The reconnection wakes every watcher (notifications sent meanwhile
	// are lost); then a's commits wake it again.
	for seq := int64(1); ; seq++ {
		if err := a.AppendEvent(ctx, event.Event{Seq: seq, TurnID: "t1", Type: event.TypeLLMDelta, At: time.Now(), Data: &event.LLMDelta{Text: "x"}}); err != nil {
			t.Fatal(err)
		}
		select {
		case <-wake:
			select {
			case <-wake: // drain the reconnection's wake-up, if it came first
			default:
			}
			if err := a.AppendEvent(ctx, event.Event{Seq: seq + 1, TurnID: "t1", Type: event.TypeLLMDelta, At: time.Now(), Data: &event.LLMDelta{Text: "y"}}); err != nil {
				t.Fatal(err)
			}
			select {
			case <-wake:
				return
			case <-time.After(20 * time.Second):
				t.Fatal("b's watcher was not woken by a's commit after the reconnection")
			}
		case <-time.After(200 * time.Millisecond):
			if seq > 100 {
				t.Fatal("b never heard of a's commits again")
			}
		}
	}
}

// TestPing: the store answers Ping while the database does, and not once
// it is closed.
func TestPing(t *testing.T) {
	s := open(t, testenv.Postgres(t), postgres.Options{})
	if err := s.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := s.Ping(context.Background()); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("Ping after Close: %v", err)
	}
}

// TestNumberedEventsFromTwoStores: two stores (two workers) append events
// of one turn with seq 0 at once; the database numbers them 1..N with no
// gap and no duplicate, each store's own events in the order it queued
// them, and a follower that reads after the last seq it saw, while they
// write, sees every event once.
func TestNumberedEventsFromTwoStores(t *testing.T) {
	dsn := testenv.Postgres(t)
	a := open(t, dsn, postgres.Options{})
	defer a.Close()
	b := open(t, dsn, postgres.Options{})
	defer b.Close()
	ctx := context.Background()
	if err := a.BeginTurn(ctx, store.TurnStart{TurnID: "t1", Input: "go", Engine: "test"}); err != nil {
		t.Fatal(err)
	}
	const each = 300
	var wg sync.WaitGroup
	for w, s := range []*postgres.Store{a, b} {
		wg.Go(func() {
			for i := range each {
				e := event.Event{TurnID: "t1", Type: event.TypeStillWorking, At: time.Now(),
					Data: &event.StillWorking{Subject: fmt.Sprintf("w%d", w), ElapsedMS: int64(i)}}
				if i%50 == 49 {
					if err := s.AppendEvent(ctx, e); err != nil { // a group of its own, waited for
						t.Error(err)
					}
					continue
				}
				s.QueueEvent(e, func(err error) {
					if err != nil {
						t.Error(err)
					}
				})
			}
			if err := s.Flush(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	// A follower reading as they write.
	seen := map[int64]int{}
	var after int64
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for finished := false; ; {
		select {
		case <-done:
			finished = true
		default:
		}
		evs, err := a.Events(ctx, "t1", after, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range evs {
			seen[e.Seq]++
			after = e.Seq
		}
		if finished && len(evs) == 0 {
			break
		}
	}
	if len(seen) != 2*each {
		t.Fatalf("the follower saw %d distinct events, want %d", len(seen), 2*each)
	}
	for seq := int64(1); seq <= 2*each; seq++ {
		if seen[seq] != 1 {
			t.Fatalf("seq %d seen %d times", seq, seen[seq])
		}
	}
	evs, _ := b.Events(ctx, "t1", 0, 0)
	last := map[string]int64{"w0": -1, "w1": -1}
	for _, e := range evs {
		d := e.Data.(*event.StillWorking)
		if d.ElapsedMS <= last[d.Subject] {
			t.Fatalf("%s's events out of order: %d after %d", d.Subject, d.ElapsedMS, last[d.Subject])
		}
		last[d.Subject] = d.ElapsedMS
	}
}

// TestEngineTurnsAreNoOrphans: a turn an engine runs (TurnStart.Engine)
// has no owner, and no store marks it interrupted when the gateway that
// stored it goes away; only its FinishTurn ends it.
func TestEngineTurnsAreNoOrphans(t *testing.T) {
	dsn := testenv.Postgres(t)
	a := open(t, dsn, postgres.Options{Heartbeat: time.Hour})
	ctx := context.Background()
	if err := a.BeginTurn(ctx, store.TurnStart{TurnID: "engine", Input: "go", Engine: "temporal"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := storetest.WriteRunningTurn(a, "own"); err != nil {
		t.Fatal(err)
	}
	a.Crash()
	sql(t, dsn, `UPDATE owners SET heartbeat_at = now() - interval '1 day' WHERE owner_id = $1`, a.Owner())
	b := open(t, dsn, postgres.Options{Heartbeat: time.Hour})
	defer b.Close()
	b.SeenFor(48 * time.Hour)
	ids, err := b.Recover()
	if err != nil {
		t.Fatal(err)
	}
	ids = append(b.Recovered(), ids...) // Open looked first
	if fmt.Sprint(ids) != "[own]" {
		t.Errorf("marked %v interrupted, want only the gateway's own turn", ids)
	}
	if rec, err := b.Turn(ctx, "engine"); err != nil || rec.Status != budget.StatusRunning {
		t.Errorf("the engine's turn: %v %v, want running", rec.Status, err)
	}
}

// TestCallerGoneCancelsItsEngineTurn: a turn an engine runs for a
// gateway's client (store.TurnStart.Caller) is cancelled as client_gone
// when that gateway is taken for gone — its units, watching through
// another store (a worker's), are told at once and why — while a detached
// one (no caller) runs on.
func TestCallerGoneCancelsItsEngineTurn(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	gateway := open(t, dsn, postgres.Options{Heartbeat: time.Hour})
	worker := open(t, dsn, postgres.Options{Heartbeat: time.Hour, Poll: time.Hour})
	defer worker.Close()
	for id, caller := range map[string]string{"called": gateway.Owner(), "detached": ""} {
		if err := gateway.BeginTurn(ctx, store.TurnStart{TurnID: id, Engine: "temporal", Caller: caller, Input: "go"}); err != nil {
			t.Fatal(err)
		}
	}
	called, unwatch := worker.WatchCancel("called")
	defer unwatch()
	detached, unwatch2 := worker.WatchCancel("detached")
	defer unwatch2()
	gateway.Crash()
	sql(t, dsn, `UPDATE owners SET heartbeat_at = now() - interval '1 day' WHERE owner_id = $1`, gateway.Owner())
	worker.SeenFor(48 * time.Hour)
	if _, err := worker.Recover(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-called:
	case <-time.After(10 * time.Second):
		t.Fatal("the called turn's units were not told")
	}
	ce, err := worker.CancelReason(ctx, "called")
	if err != nil || ce == nil || ce.Reason != budget.ClientGone || !strings.Contains(ce.By, "following it for its client") {
		t.Fatalf("cancel reason: %+v %v", ce, err)
	}
	select {
	case <-detached:
		t.Fatal("the detached turn was cancelled")
	default:
	}
	if ce, err := worker.CancelReason(ctx, "detached"); err != nil || ce != nil {
		t.Fatalf("the detached turn has a cancel request: %+v %v", ce, err)
	}
	// Engine turns are the engine's to end: neither is interrupted.
	for _, id := range []string{"called", "detached"} {
		if rec, err := worker.Turn(ctx, id); err != nil || rec.Status != budget.StatusRunning {
			t.Fatalf("%s: %v %v", id, rec.Status, err)
		}
	}
}

// TestAdoptTurns: the engine turns a gateway follows are adopted by no
// one while it lives; once it is taken for gone, by exactly one of the
// gateways of their agent that look at once, and by another once that
// one is gone in turn. A gateway shut down leaves its turns to be
// adopted at once.
func TestAdoptTurns(t *testing.T) {
	dsn := testenv.Postgres(t)
	ctx := context.Background()
	o := postgres.Options{Heartbeat: time.Hour, Poll: time.Hour}
	a, b, c := open(t, dsn, o), open(t, dsn, o), open(t, dsn, o)
	defer b.Close()
	defer c.Close()
	for id, agent := range map[string]string{"mine": "x", "theirs": "y"} {
		if err := a.BeginTurn(ctx, store.TurnStart{TurnID: id, Engine: "temporal", Agent: agent, Follower: a.Owner(), Input: "go"}); err != nil {
			t.Fatal(err)
		}
	}
	// Agent x's turn on another task queue: its engine names the queue.
	if err := a.BeginTurn(ctx, store.TurnStart{TurnID: "queued", Engine: "temporal/other", Agent: "x", Follower: a.Owner(), Input: "go"}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*postgres.Store{b, c} {
		s.SeenFor(48 * time.Hour)
		if got, err := s.AdoptTurns(ctx, "temporal", "x", 10); err != nil || len(got) != 0 {
			t.Fatalf("adopted %v (%v) while their follower lives", got, err)
		}
	}
	// a is killed, and taken for gone.
	a.Crash()
	sql(t, dsn, `UPDATE owners SET heartbeat_at = now() - interval '1 day' WHERE owner_id = $1`, a.Owner())
	if _, err := b.Recover(); err != nil {
		t.Fatal(err)
	}
	type adopted struct {
		by  *postgres.Store
		ids []string
	}
	got := make(chan adopted, 2)
	for _, s := range []*postgres.Store{b, c} {
		go func() {
			ids, err := s.AdoptTurns(ctx, "temporal", "x", 10)
			if err != nil {
				t.Error(err)
			}
			got <- adopted{s, ids}
		}()
	}
	one, two := <-got, <-got
	if len(one.ids) == 0 {
		one, two = two, one
	}
	if len(one.ids) != 1 || one.ids[0] != "mine" || len(two.ids) != 0 {
		t.Fatalf("adopted %v and %v, want [mine] once: the turns of agent x", one.ids, two.ids)
	}
	holder, other := one.by, two.by
	if who, err := other.Follower(ctx, "mine"); err != nil || who != holder.Owner() {
		t.Fatalf("the follower of the adopted turn is %q (%v), want its adopter's owner %q", who, err, holder.Owner())
	}
	if ids, err := other.AdoptTurns(ctx, "temporal/other", "x", 10); err != nil || len(ids) != 1 || ids[0] != "queued" {
		t.Fatalf("adopted %v (%v) on the other queue, want [queued]", ids, err)
	}
	if _, err := other.Follower(ctx, "nothing"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the follower of a turn not stored: %v, want store.ErrNotFound", err)
	}
	if ids, err := other.AdoptTurns(ctx, "temporal", "x", 10); err != nil || len(ids) != 0 {
		t.Fatalf("adopted %v (%v) from a live adopter", ids, err)
	}
	// The adopter shuts down: its row goes with it, and the turn passes on.
	if err := holder.Close(); err != nil {
		t.Fatal(err)
	}
	if ids, err := other.AdoptTurns(ctx, "temporal", "x", 10); err != nil || len(ids) != 1 || ids[0] != "mine" {
		t.Fatalf("adopted %v (%v) after its adopter shut down, want [mine]", ids, err)
	}
}

// TestAnOutageKillsNothing: after an outage every gateway's heartbeat is
// old. The first gateway back must not take the others for gone: it judges
// only once it has itself seen the database for a full window of theirs —
// by which time every live gateway has beaten again.
func TestAnOutageKillsNothing(t *testing.T) {
	dsn := testenv.Postgres(t)
	a := open(t, dsn, postgres.Options{Heartbeat: 100 * time.Millisecond})
	defer a.Close()
	if _, _, err := storetest.WriteRunningTurn(a, "t1"); err != nil {
		t.Fatal(err)
	}
	b := open(t, dsn, postgres.Options{Heartbeat: time.Hour})
	defer b.Close()
	// Nobody could beat for a day; b has just come back.
	sql(t, dsn, `UPDATE owners SET heartbeat_at = now() - interval '1 day'`)
	if ids, err := b.Recover(); err != nil || len(ids) != 0 {
		t.Fatalf("the first gateway back took %v for gone (%v)", ids, err)
	}
	// b has seen the database for a while now; a beat meanwhile.
	conn, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for deadline := time.Now().Add(10 * time.Second); ; {
		var fresh bool
		if err := conn.QueryRow(context.Background(), `SELECT heartbeat_at > now() - interval '1 minute' FROM owners WHERE owner_id = $1`,
			a.Owner()).Scan(&fresh); err != nil {
			t.Fatal(err)
		}
		if fresh {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a did not beat again")
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.SeenFor(time.Minute)
	if ids, err := b.Recover(); err != nil || len(ids) != 0 {
		t.Fatalf("a live gateway taken for gone: %v (%v)", ids, err)
	}
	if rec, err := b.Turn(context.Background(), "t1"); err != nil || rec.Status != budget.StatusRunning {
		t.Fatalf("%v %v", rec.Status, err)
	}
}

// TestAHungDatabaseKillsNothing: a database that hangs (SIGSTOP, a
// frozen VM) fails no heartbeat: each waits and is answered once it is
// back, and every heartbeat is then as old as the hang. A judge that saw
// the database before it hung must not take the others for gone: not in
// a statement that waited through the hang (its own heartbeat is as old
// as theirs), nor right after its own next heartbeat (the gap starts its
// window again), only once it has seen the database for a full window.
func TestAHungDatabaseKillsNothing(t *testing.T) {
	dsn := testenv.Postgres(t)
	judge := open(t, dsn, postgres.Options{Heartbeat: time.Hour})
	defer judge.Close()
	other := open(t, dsn, postgres.Options{Heartbeat: time.Hour})
	defer other.Close()
	if _, _, err := storetest.WriteRunningTurn(other, "t1"); err != nil {
		t.Fatal(err)
	}
	judge.SeenFor(24 * time.Hour) // it has seen the database for long
	// The database hung for a day: nobody's heartbeat was answered.
	sql(t, dsn, `UPDATE owners SET heartbeat_at = heartbeat_at - interval '1 day'`)
	if ids, err := judge.Recover(); err != nil || len(ids) != 0 {
		t.Fatalf("a judge whose own heartbeat is as old took %v for gone (%v)", ids, err)
	}
	if err := judge.Beat(); err != nil {
		t.Fatal(err)
	}
	if ids, err := judge.Recover(); err != nil || len(ids) != 0 {
		t.Fatalf("a judge that has just come back from the hang took %v for gone (%v)", ids, err)
	}
	if rec, err := judge.Turn(context.Background(), "t1"); err != nil || rec.Status != budget.StatusRunning {
		t.Fatalf("%v %v", rec.Status, err)
	}
	// A full window later, the other still silent, it is gone.
	judge.SeenFor(24 * time.Hour)
	if ids, err := judge.Recover(); err != nil || !slices.Equal(ids, []string{"t1"}) {
		t.Fatalf("a silent store's turn was not taken for gone: %v (%v)", ids, err)
	}
}

// TestKeyValueConnectionStrings: a libpq key=value string is a PostgreSQL
// database, not a SQLite file's name; its password is never shown, and it
// opens (with timebox_heartbeat taken out of it).
func TestKeyValueConnectionStrings(t *testing.T) {
	for db, want := range map[string]bool{
		"postgres://u@h/db":                                    true,
		"host=db.example dbname=tb user=u":                     true,
		"dbname=tb":                                            true,
		"  host = db password='s e c' dbname=x":                true,
		"timebox.db":                                           false,
		"./data/host=x.db":                                     false,
		"/var/lib/timebox/timebox.db":                          false,
		"file:timebox.db?mode=rwc":                             false,
		"my turns (hostname=foo).db":                           false,
		"host=127.0.0.1 user=u password=hunter://5 dbname=app": true,
		"sslmode=disable options=-csearch_path=a://b":          true,
		"Postgres://bob:hunter2@db.example/app":                true,
		"POSTGRESQL://db.example/app":                          true,
		"mysql://bob:hunter2@db.example/app":                   true,
		"http://db.example/app":                                true,
		"HOST=db.example PASSWORD=hunter2":                     true,
		"sslpassword=hunter2 sslkey=k.pem":                     true,
		"sqlite:timebox.db":                                    false,
		"sqlite:///var/lib/timebox/timebox.db":                 false,
		"file:///var/lib/timebox/timebox.db":                   false,
		`C://data/timebox.db`:                                  false,
	} {
		if got := postgres.IsURL(db); got != want {
			t.Errorf("IsURL(%q) = %v, want %v", db, got, want)
		}
	}
	for dsn, want := range map[string]string{
		"host=db password=hunter2 dbname=x":          "host=db password=xxxxx dbname=x",
		`host=db password='it\'s a secret' dbname=x`: "host=db password=xxxxx dbname=x",
		"postgres://u:hunter2@db/x?sslmode=disable":  "postgres://u:xxxxx@db/x?sslmode=disable",
		"host=db dbname=x":                           "host=db dbname=x",
		"host=db password=hunter://2 dbname=x":       "host=db password=xxxxx dbname=x",
	} {
		if got := postgres.Redact(dsn); got != want {
			t.Errorf("Redact(%q) = %q, want %q", dsn, got, want)
		}
	}
	u, err := url.Parse(testenv.Postgres(t))
	if err != nil {
		t.Fatal(err)
	}
	kv := fmt.Sprintf("host=%s port=%s user=%s dbname=%s sslmode=disable %s=250ms", u.Hostname(), u.Port(), u.User.Username(),
		strings.TrimPrefix(u.Path, "/"), postgres.HeartbeatParam)
	st := open(t, kv, postgres.Options{})
	defer st.Close()
	if err := st.BeginTurn(context.Background(), store.TurnStart{TurnID: "kv", Input: "go"}); err != nil {
		t.Fatal(err)
	}
}

// TestALostCommitAnswerStoresNothingTwice: a group of numbered events
// whose commit was stored but answered by an error (the connection cut as
// the database committed) is committed again by the queue; it must find
// that it was stored, and give its events the seqs they were stored with,
// rather than number and store them a second time.
func TestALostCommitAnswerStoresNothingTwice(t *testing.T) {
	dsn := testenv.Postgres(t)
	a := open(t, dsn, postgres.Options{})
	defer a.Close()
	ctx := context.Background()
	if err := a.BeginTurn(ctx, store.TurnStart{TurnID: "t1", Input: "go", Engine: "test"}); err != nil {
		t.Fatal(err)
	}
	a.LoseCommitAnswers(3)
	const n = 20
	var mu sync.Mutex
	got := map[int64]bool{}
	var wg sync.WaitGroup
	wg.Add(n)
	for i := range n {
		e := event.Event{TurnID: "t1", Type: event.TypeStillWorking, At: time.Now(),
			Data: &event.StillWorking{Subject: "w", ElapsedMS: int64(i)}}
		a.QueueEvent(e, func(err error) {
			defer wg.Done()
			if err != nil {
				t.Error(err)
			}
		})
		if i%5 == 4 {
			if err := a.Flush(ctx); err != nil { // several groups
				t.Fatal(err)
			}
		}
	}
	wg.Wait()
	evs, err := a.Events(ctx, "t1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		mu.Lock()
		if got[e.Seq] {
			t.Errorf("seq %d twice", e.Seq)
		}
		got[e.Seq] = true
		mu.Unlock()
	}
	if len(evs) != n {
		t.Fatalf("%d events stored, want %d: a group whose answer was lost was stored again", len(evs), n)
	}
	for i, e := range evs {
		if d := e.Data.(*event.StillWorking); d.ElapsedMS != int64(i) || e.Seq != int64(i+1) {
			t.Fatalf("event %d: seq %d, elapsed %d", i, e.Seq, d.ElapsedMS)
		}
	}
}

// TestLongAnswerStoredOnce: a turn's long answer is stored once, in pieces
// of at most 256 KiB, and its turn_finished event, record, message and
// session message name it instead of holding a copy (issue 29: the turn's
// end sent the answer six times over and marshalled every event again).
func TestLongAnswerStoredOnce(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	s := open(t, dsn, postgres.Options{})
	defer s.Close()
	_, msgs := storetest.LongTurn(t, s, "l1", "ls")
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	storetest.StoredOnce(t, msgs, "octet_length(%s)", func(q string) store.Rows {
		rows, err := conn.Query(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		return rows
	})
}

// TestNumberedLongAnswerStoredOnce: an event the store numbers (seq 0, as
// the Temporal engine's workers queue them) is kept as any other, its long
// texts apart. Numbering marshalled it whole again, so a long answer was
// stored twice: in turn_finished and apart.
func TestNumberedLongAnswerStoredOnce(t *testing.T) {
	ctx := context.Background()
	dsn := testenv.Postgres(t)
	s := open(t, dsn, postgres.Options{})
	defer s.Close()
	if err := s.BeginTurn(ctx, store.TurnStart{TurnID: "n1", SessionID: "ns", Input: "go", Engine: "test", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	answer := storetest.LongAnswer
	fin := &event.TurnFinished{Status: budget.StatusCompleted, StopReason: budget.Answered, Message: "Answered.", Answer: answer}
	var queued error
	s.QueueEvent(event.Event{TurnID: "n1", Type: event.TypeTurnFinished, At: time.Now(), Data: fin}, func(err error) { queued = err })
	if err := s.Flush(ctx); err != nil || queued != nil {
		t.Fatal(err, queued)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var n int
	if err := conn.QueryRow(ctx, `SELECT octet_length(data) FROM events WHERE turn_id = 'n1' AND type = 'turn_finished'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n > 4096 {
		t.Errorf("the numbered turn_finished holds %d bytes: a copy of its %d-byte answer", n, len(answer))
	}
	evs, err := s.Events(ctx, "n1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Seq != 1 {
		t.Fatalf("events %v, want turn_finished numbered 1", evs)
	}
	if got := evs[0].Data.(*event.TurnFinished).Answer; got != answer {
		t.Errorf("its answer read back: %d bytes, want %d", len(got), len(answer))
	}
}

// TestLongTextsGoOnAfterCuts: a long text whose writes are cut now and
// then — every second piece fails as if its connection was cut — is
// stored: each try goes on from the pieces stored before, and none is
// written twice. In one transaction, as before, every try failed at its
// second piece and the text was never stored (the fault suite's "long
// reply on PostgreSQL, connections killed" stored it 16.5 s after
// turn_finished once, past its bound of 10 s).
func TestLongTextsGoOnAfterCuts(t *testing.T) {
	dsn := testenv.Postgres(t)
	s := open(t, dsn, postgres.Options{})
	defer s.Close()
	var tries, cuts int
	postgres.BeforePiece(func() error {
		tries++
		if tries%2 == 0 {
			cuts++
			return fmt.Errorf("a cut connection: %w", io.ErrUnexpectedEOF)
		}
		return nil
	})
	defer postgres.BeforePiece(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	if err := s.BeginTurn(ctx, store.TurnStart{TurnID: "c1", SessionID: "cs", Input: "go", Engine: "test", StartedAt: start}); err != nil {
		t.Fatal(err)
	}
	answer, result := storetest.LongAnswer, strings.Repeat("r", 600_000)
	fin := &event.TurnFinished{Status: budget.StatusCompleted, StopReason: budget.Answered, Message: answer, Answer: answer}
	var queued error
	s.QueueEvent(event.Event{TurnID: "c1", Type: event.TypeTurnFinished, At: start, Data: fin}, func(err error) { queued = err })
	if err := s.Flush(ctx); err != nil {
		t.Fatalf("turn_finished with a long answer not stored while its pieces were cut: %v", err)
	}
	if queued != nil {
		t.Fatal(queued)
	}
	rec := &event.Turn{TurnID: "c1", SessionID: "cs", Agent: "test", Input: "go", Status: budget.StatusCompleted,
		StopReason: budget.Answered, Message: answer, Answer: answer, StartedAt: start, EndedAt: start.Add(time.Second)}
	msgs := []model.Message{
		{Role: model.RoleUser, Content: "go"},
		{Role: model.RoleAssistant, ToolCalls: []model.ToolCall{{ID: "x", Name: "echo", Arguments: "{}"}}},
		{Role: model.RoleTool, Content: result, ToolCallID: "x", ToolName: "echo"},
		{Role: model.RoleAssistant, Content: answer},
	}
	if err := s.FinishTurn(ctx, rec, msgs); err != nil {
		t.Fatalf("the end with a long tool result not stored while its pieces were cut: %v", err)
	}
	pieces := (len(answer)+store.TextPiece-1)/store.TextPiece + (len(result)+store.TextPiece-1)/store.TextPiece
	if cuts == 0 || tries-cuts != pieces {
		t.Errorf("%d pieces written (%d tries, %d cut), want %d: a piece stored before a cut was written again", tries-cuts, tries, cuts, pieces)
	}
	got, err := s.Turn(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Answer != answer || got.Message != answer {
		t.Errorf("stored answer %d bytes, message %d, want %d", len(got.Answer), len(got.Message), len(answer))
	}
	hist, err := s.History(ctx, "cs")
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != len(msgs) || hist[2].Content != result || hist[3].Content != answer {
		t.Errorf("stored conversation of %d messages, not the one given", len(hist))
	}
}

// TestReadsAfterConnectionsAreCut: right after pg_terminate_backend cut
// every connection (the pool's idle ones are found dead only when used),
// reads and a cancel request from another store succeed: they are tried
// again on a fresh connection. (A cancel through another gateway failed
// with 500, and the turn ran on.)
func TestReadsAfterConnectionsAreCut(t *testing.T) {
	dsn := testenv.Postgres(t)
	a := open(t, dsn, postgres.Options{})
	defer a.Close()
	if _, _, err := storetest.WriteRunningTurn(a, "t1"); err != nil {
		t.Fatal(err)
	}
	b := open(t, dsn, postgres.Options{})
	defer b.Close()
	ctx := context.Background()
	for round := range 3 {
		// Several idle connections in b's pool.
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() { b.Turn(ctx, "t1") })
		}
		wg.Wait()
		sql(t, dsn, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
		if rec, err := b.Turn(ctx, "t1"); err != nil || rec.Status != budget.StatusRunning {
			t.Fatalf("round %d: reading the turn after the cut: %v", round, err)
		}
		if _, err := b.Events(ctx, "t1", 0, 0); err != nil {
			t.Fatalf("round %d: its events: %v", round, err)
		}
		sql(t, dsn, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()`)
		if err := b.RequestCancel(ctx, "t1"); err != nil {
			t.Fatalf("round %d: a cancel after the cut: %v", round, err)
		}
	}
}

// TestReadsOfAnAwayDatabaseAreUnavailable: a read whose database cannot be
// reached says so (store.ErrUnavailable: 503 store_unavailable at the HTTP
// API, ask again shortly), not as a failure of the store (500): a person
// deciding a call during an outage was told only that reading the turn
// failed.
func TestReadsOfAnAwayDatabaseAreUnavailable(t *testing.T) {
	pg := testenv.StartPostgres(t)
	st := open(t, pg.Database(), postgres.Options{})
	defer st.Close()
	ctx := context.Background()
	if err := st.BeginTurn(ctx, store.TurnStart{TurnID: "t1", Input: "go"}); err != nil {
		t.Fatal(err)
	}
	pg.Stop()
	defer pg.Start()
	_, err := st.Turn(ctx, "t1")
	if !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Turn: %v", err)
	}
	if _, err := st.Approvals(ctx, "t1"); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Approvals: %v", err)
	}
	if _, err := st.ListDeliveries(ctx, store.DeliveryFilter{}); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("ListDeliveries: %v", err)
	}
	if err := st.RequestCancel(ctx, "t1"); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("RequestCancel: %v", err)
	}
	if _, err := st.ToolStats(ctx, store.StatsFilter{}); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("ToolStats: %v", err)
	}
	if _, err := st.ModelStats(ctx, store.StatsFilter{}); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("ModelStats: %v", err)
	}
	if _, err := st.ToolHistogram(ctx, store.StatsFilter{}, "fetch", []int64{100}); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("ToolHistogram: %v", err)
	}
}

// TestALostAnswerRecordsAWebhookAttemptOnce: a webhook attempt's record
// whose commit was stored but whose answer was lost (the connection cut as
// the database committed) is tried again, finds the lease ended by its own
// commit, and is stored: once, not refused as a lease another gateway
// took (whose log line said so, though nothing was lost).
func TestALostAnswerRecordsAWebhookAttemptOnce(t *testing.T) {
	st := open(t, testenv.Postgres(t), postgres.Options{})
	defer st.Close()
	ctx := context.Background()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	d := store.Delivery{ID: "msg_a", URL: "http://example.test/hook", EventType: "turn_finished", TurnID: "t1", Seq: 7,
		Body: []byte(`{}`), CreatedAt: now, NextAttemptAt: now}
	if err := st.EnqueueDeliveries(ctx, []store.Delivery{d}); err != nil {
		t.Fatal(err)
	}
	if got, err := st.ClaimDeliveries(ctx, "g1", now, time.Minute, 10); err != nil || len(got) != 1 {
		t.Fatalf("claimed %+v (%v)", got, err)
	}
	st.LoseDurableAnswers(1)
	a := store.DeliveryAttempt{At: now.Add(time.Second), Status: 204, DurationMS: 3, By: "g1"}
	if err := st.RecordAttempt(ctx, "msg_a", "g1", a, store.DeliveryDelivered, time.Time{}); err != nil {
		t.Fatalf("an attempt whose commit's answer was lost: %v", err)
	}
	list, err := st.ListDeliveries(ctx, store.DeliveryFilter{})
	if err != nil || len(list) != 1 || list[0].State != store.DeliveryDelivered || len(list[0].Attempts) != 1 {
		t.Fatalf("deliveries %+v (%v), want msg_a delivered with one attempt", list, err)
	}
	// Another gateway's lease is still refused.
	if err := st.EnqueueDeliveries(ctx, []store.Delivery{{ID: "msg_b", URL: d.URL, EventType: d.EventType, TurnID: "t1", Seq: 8,
		Body: []byte(`{}`), CreatedAt: now, NextAttemptAt: now}}); err != nil {
		t.Fatal(err)
	}
	if got, err := st.ClaimDeliveries(ctx, "g2", now, time.Minute, 10); err != nil || len(got) != 1 {
		t.Fatalf("claimed %+v (%v)", got, err)
	}
	if err := st.RecordAttempt(ctx, "msg_b", "g1", a, store.DeliveryDelivered, time.Time{}); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("an attempt on another gateway's lease: %v, want ErrLeaseLost", err)
	}
}
