package sqlite_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/sqlite"
	"github.com/timebox-run/timebox/store/storetest"
)

// helperEnv makes the test binary a process that writes a turn into the
// store named by the variable and then waits to be killed.
const helperEnv = "TIMEBOX_SQLITE_CRASH_HELPER"

func TestMain(m *testing.M) {
	if path := os.Getenv(helperEnv); path != "" {
		crashHelper(path)
		return
	}
	goleak.VerifyTestMain(m)
}

func open(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return open(t, filepath.Join(t.TempDir(), "timebox.db")) })
}

func TestCrash(t *testing.T) {
	storetest.RunCrash(t, func(t *testing.T) (store.Store, func(func(store.Ending)) store.Store) {
		path := filepath.Join(t.TempDir(), "timebox.db")
		s := open(t, path)
		return s, func(ended func(store.Ending)) store.Store {
			s.Crash()
			after, err := sqlite.Open(path, sqlite.Options{Ended: ended})
			if err != nil {
				t.Fatal(err)
			}
			return after
		}
	}, "the store running it was closed without finishing it")
}

func TestMigrationsFromAnEmptyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	if err := os.WriteFile(path, nil, 0o600); err != nil { // an empty file is an empty database
		t.Fatal(err)
	}
	s := open(t, path)
	s.Close()
	s = open(t, path) // reopening migrates nothing
	s.Close()

	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var v int
	var mode string
	if err := db.QueryRow("PRAGMA user_version").Scan(&v); err != nil || v != sqlite.SchemaVersion {
		t.Fatalf("user_version %d, %v", v, err)
	}
	if err := db.QueryRow("PRAGMA journal_mode").Scan(&mode); err != nil || mode != "wal" {
		t.Fatalf("journal_mode %q, %v", mode, err)
	}
	for _, table := range []string{"owners", "sessions", "turns", "events", "tool_calls", "model_calls", "messages"} {
		var n int
		if err := db.QueryRow("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?", table).Scan(&n); err != nil || n != 1 {
			t.Errorf("table %s: %d, %v", table, n, err)
		}
	}
	// A file from a newer timebox is refused, not damaged.
	if _, err := db.Exec(fmt.Sprintf("PRAGMA user_version = %d", sqlite.SchemaVersion+1)); err != nil {
		t.Fatal(err)
	}
	_, err = sqlite.Open(path, sqlite.Options{})
	if err == nil || !strings.Contains(err.Error(), "newer than this timebox") {
		t.Fatalf("newer schema: %v", err)
	}
}

func TestBadPath(t *testing.T) {
	for _, p := range []string{"", "a?b.db", filepath.Join(t.TempDir(), "no", "such", "dir", "x.db")} {
		if s, err := sqlite.Open(p, sqlite.Options{}); err == nil {
			s.Close()
			t.Errorf("Open(%q) worked", p)
		}
	}
	// A directory, or a file that is no database, is said in a person's
	// words, not SQLite's ("unable to open database file (14)", "file is
	// not a database (26)"), and the file is left as it was.
	dir := t.TempDir()
	other := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(other, []byte("model: {primary: 'script:m'}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{dir: "it is a directory (name the store's file, such as " + filepath.Join(dir, "timebox.db"),
		other: "the file is not a SQLite database"} {
		_, err := sqlite.Open(p, sqlite.Options{})
		_, rerr := sqlite.OpenReadOnly(p)
		for _, err := range []error{err, rerr} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: %v, want %q", p, err, want)
			}
		}
	}
	if b, _ := os.ReadFile(other); string(b) != "model: {primary: 'script:m'}\n" {
		t.Errorf("the file that is no database was changed: %q", b)
	}
	// Another program's SQLite database gets no tables of timebox's.
	foreign := filepath.Join(dir, "other.db")
	db, err := sql.Open("sqlite", foreign)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE foo (x)`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	if s, err := sqlite.Open(foreign, sqlite.Options{}); err == nil || !strings.Contains(err.Error(), `not a store of timebox's (it has a table "foo" of its own)`) {
		if s != nil {
			s.Close()
		}
		t.Errorf("another program's database: %v", err)
	}
	db, _ = sql.Open("sqlite", foreign)
	defer db.Close()
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM sqlite_master WHERE type = 'table'`).Scan(&n); err != nil || n != 1 {
		t.Errorf("%d tables in it after, %v", n, err)
	}
}

var (
	writeRunningTurn = storetest.WriteRunningTurn
	checkInterrupted = storetest.CheckInterrupted
)

func TestCrashLeavesTheTurnInterrupted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	a := open(t, path)
	n, _, err := writeRunningTurn(a, "t1")
	if err != nil {
		t.Fatal(err)
	}
	a.Crash() // it writes what was queued first

	b := open(t, path)
	defer b.Close()
	if got := b.Recovered(); len(got) != 1 || got[0] != "t1" {
		t.Fatalf("Recovered() = %v", got)
	}
	checkInterrupted(t, b, "t1", n, n, "the store running it was closed without finishing it")
}

func TestKill9(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("helper: %v", err)
	}
	var n, kept int
	if _, err := fmt.Sscanf(line, "ready %d %d", &n, &kept); err != nil {
		t.Fatalf("helper said %q", line)
	}
	cmd.Process.Kill() // SIGKILL: no cleanup of any kind
	cmd.Wait()

	s := open(t, path)
	defer s.Close()
	// What was still queued when the process died may be lost; the call
	// records never are.
	checkInterrupted(t, s, "t1", n, kept, fmt.Sprintf("(pid %d) stopped", cmd.Process.Pid))
}

func crashHelper(path string) {
	s, err := sqlite.Open(path, sqlite.Options{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	n, kept, err := writeRunningTurn(s, "t1")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("ready %d %d\n", n, kept)
	select {}
}

// TestCloseStoresWhatIsQueued: a clean stop stores every queued event
// before it marks the turn interrupted.
func TestCloseStoresWhatIsQueued(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	a := open(t, path)
	ctx := context.Background()
	if err := a.BeginTurn(ctx, store.TurnStart{TurnID: "t1", Input: "x", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	const n = 3000
	for seq := int64(1); seq <= n; seq++ {
		a.QueueEvent(event.Event{Seq: seq, TurnID: "t1", Type: event.TypeLLMDelta, At: time.Now(), Data: &event.LLMDelta{Text: "x"}}, nil)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	b := open(t, path)
	defer b.Close()
	evs, err := b.Events(ctx, "t1", 0, 0)
	if err != nil || len(evs) != n+1 || evs[n].Type != event.TypeTurnFinished {
		t.Fatalf("%d events stored (want %d and the interrupted turn_finished), %v", len(evs), n, err)
	}
}

func TestALiveOwnerKeepsItsTurns(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	a := open(t, path)
	if _, _, err := writeRunningTurn(a, "t1"); err != nil {
		t.Fatal(err)
	}
	// A second process (here a second store) opening the file must not
	// take the first one's running turn for a crashed one.
	b := open(t, path)
	if got := b.Recovered(); len(got) != 0 {
		t.Fatalf("live turn marked interrupted: %v", got)
	}
	rec, err := b.Turn(context.Background(), "t1")
	if err != nil || rec.Status != budget.StatusRunning {
		t.Fatalf("%v %v", rec.Status, err)
	}
	b.Close()
	// Closing the owner marks what it left running.
	a.Close()
	c := open(t, path)
	defer c.Close()
	rec, err = c.Turn(context.Background(), "t1")
	if err != nil || rec.Status != budget.StatusInterrupted || !strings.Contains(rec.Message, "the store was closed") {
		t.Fatalf("%+v %v", rec, err)
	}
}

func TestOwnersJudgedByPidAndHeartbeat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	s := open(t, path)
	if _, _, err := writeRunningTurn(s, "dead-pid"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := writeRunningTurn(s, "other-machine-stale"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := writeRunningTurn(s, "other-machine-fresh"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := writeRunningTurn(s, "no-owner"); err != nil {
		t.Fatal(err)
	}
	s.Crash()

	// A process that has exited, on this machine.
	gone := exec.Command("true")
	if err := gone.Run(); err != nil {
		t.Skip("no true(1):", err)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var machine string
	if err := db.QueryRow(`SELECT machine FROM owners`).Scan(&machine); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, o := range []struct {
		id, machine string
		pid         int
		heartbeat   time.Time
	}{
		{"o-dead", machine, gone.Process.Pid, now},
		{"o-stale", "elsewhere", 1, now.Add(-time.Hour)},
		{"o-fresh", "elsewhere", 1, now},
	} {
		if _, err := db.Exec(`INSERT INTO owners (owner_id, pid, machine, started_at, heartbeat_at) VALUES (?, ?, ?, ?, ?)`,
			o.id, o.pid, o.machine, now.UnixNano(), o.heartbeat.UnixNano()); err != nil {
			t.Fatal(err)
		}
	}
	for turn, owner := range map[string]string{"dead-pid": "o-dead", "other-machine-stale": "o-stale",
		"other-machine-fresh": "o-fresh", "no-owner": "o-missing"} {
		if _, err := db.Exec(`UPDATE turns SET owner_id = ? WHERE turn_id = ?`, owner, turn); err != nil {
			t.Fatal(err)
		}
	}

	s2 := open(t, path)
	defer s2.Close()
	got := map[string]bool{}
	for _, id := range s2.Recovered() {
		got[id] = true
	}
	want := map[string]bool{"dead-pid": true, "other-machine-stale": true, "no-owner": true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("Recovered() = %v, want %v", got, want)
	}
	rec, _ := s2.Turn(context.Background(), "other-machine-stale")
	if !strings.Contains(rec.Message, "stopped sending heartbeats") {
		t.Errorf("message %q", rec.Message)
	}
}

func TestHeartbeatFindsACrashWhileOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	watcher, err := sqlite.Open(path, sqlite.Options{Heartbeat: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	a := open(t, path)
	if _, _, err := writeRunningTurn(a, "t1"); err != nil {
		t.Fatal(err)
	}
	a.Crash()
	deadline := time.Now().Add(5 * time.Second)
	for {
		rec, err := watcher.Turn(context.Background(), "t1")
		if err != nil {
			t.Fatal(err)
		}
		if rec.Status == budget.StatusInterrupted {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the running store never noticed the crash")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestConcurrentWritersShareAFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	a, b := open(t, path), open(t, path)
	defer a.Close()
	defer b.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		s := a
		if i%2 == 1 {
			s = b
		}
		wg.Go(func() {
			id := fmt.Sprintf("t%d", i)
			rec := store.NewRecorder(s)
			if err := rec.Begin(context.Background(), store.TurnStart{TurnID: id, Input: "x", StartedAt: time.Now()}); err != nil {
				errs <- err
				return
			}
			em := event.NewEmitter(id, rec)
			for range 100 {
				em.Emit(&event.LLMDelta{Text: "x"})
			}
			if err := s.Flush(context.Background()); err != nil {
				errs <- err
			}
			if err := rec.Err(); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for i := range 8 {
		evs, err := a.Events(context.Background(), fmt.Sprintf("t%d", i), 0, 0)
		if err != nil || len(evs) != 100 {
			t.Fatalf("t%d: %d events, %v", i, len(evs), err)
		}
	}
}

// TestDiskFull: on a full disk the turn's events fail saying so
// (ErrDiskFull), its end is still stored — its status and answer, and a
// message that says what could not be — so that it is not taken for a
// crash, and what was stored stays readable without writing
// (OpenReadOnly).
func TestDiskFull(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	s := open(t, path)
	ctx := context.Background()
	if err := s.BeginTurn(ctx, store.TurnStart{TurnID: "t1", Input: "go", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendEvent(ctx, event.Event{Seq: 1, TurnID: "t1", Type: event.TypeTurnStarted, At: time.Now(), Data: &event.TurnStarted{}}); err != nil {
		t.Fatal(err)
	}
	if err := s.FillDisk(0); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", 1<<20)
	err := s.AppendEvent(ctx, event.Event{Seq: 2, TurnID: "t1", Type: event.TypeToolFinished, At: time.Now(),
		Data: &event.ToolFinished{ToolCall: event.ToolCall{CallID: "c1", Tool: "big", Outcome: event.OutcomeOK, Result: big}}})
	if !errors.Is(err, sqlite.ErrDiskFull) {
		t.Fatalf("an event on a full disk: %v, want ErrDiskFull", err)
	}
	rec := &event.Turn{TurnID: "t1", Input: "go", Status: budget.StatusCompleted, StopReason: budget.Answered, Message: "the answer",
		Answer: "the answer", StartedAt: time.Now(), EndedAt: time.Now(),
		ToolCalls: []event.ToolCall{{CallID: "c1", Tool: "big", Outcome: event.OutcomeOK, Result: big}}}
	if err := s.FinishTurn(ctx, rec, nil); !errors.Is(err, sqlite.ErrDiskFull) {
		t.Fatalf("FinishTurn on a full disk: %v, want ErrDiskFull", err)
	}
	got, err := s.Turn(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if got.Status != budget.StatusCompleted || got.Answer != "the answer" || !strings.Contains(got.Message, "disk is full") {
		t.Fatalf("the stored end: %s %q %q", got.Status, got.Answer, got.Message)
	}
	s.Close()
	ro, err := sqlite.OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	if got, err := ro.Turn(ctx, "t1"); err != nil || got.Status != budget.StatusCompleted {
		t.Fatalf("read only: %v %v", got, err)
	}
	if err := ro.BeginTurn(ctx, store.TurnStart{TurnID: "t2"}); err == nil {
		t.Fatal("a read-only store began a turn")
	}
}

// TestDiskFreedMidTurn: an event a full disk lost stays lost only until
// the turn's end, which stores it with its call record, though events
// after it were stored once the disk had room again. The end used to
// store only the events past the last one stored.
func TestDiskFreedMidTurn(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "timebox.db"))
	defer s.Close()
	ctx := context.Background()
	if err := s.BeginTurn(ctx, store.TurnStart{TurnID: "t1", Input: "go", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	em := event.NewEmitter("t1")
	em.Emit(&event.TurnStarted{Input: "go"})
	big := event.ToolCall{CallID: "c1", Tool: "big", Outcome: event.OutcomeOK, Result: strings.Repeat("x", 1<<20)}
	em.Emit(&event.ToolFinished{ToolCall: big})
	small := event.ToolCall{CallID: "c2", Tool: "small", Outcome: event.OutcomeOK, Result: "ok"}
	em.Emit(&event.ToolFinished{ToolCall: small})
	em.Emit(&event.TurnFinished{Status: budget.StatusCompleted, StopReason: budget.Answered})
	em.Close()
	log := em.Log()
	if err := s.AppendEvent(ctx, log[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.FillDisk(0); err != nil {
		t.Fatal(err)
	}
	if err := s.AppendEvent(ctx, log[1]); !errors.Is(err, sqlite.ErrDiskFull) {
		t.Fatalf("an event on a full disk: %v, want ErrDiskFull", err)
	}
	if err := s.FillDisk(1 << 20); err != nil { // room again
		t.Fatal(err)
	}
	for _, e := range log[2:] {
		if err := s.AppendEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	rec := &event.Turn{TurnID: "t1", Input: "go", Status: budget.StatusCompleted, StopReason: budget.Answered,
		StartedAt: time.Now(), EndedAt: time.Now(), Events: log, ToolCalls: []event.ToolCall{big, small}}
	if err := s.FinishTurn(ctx, rec, nil); err != nil {
		t.Fatal(err)
	}
	evs, err := s.Events(ctx, "t1", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != len(log) || evs[1].Type != event.TypeToolFinished {
		t.Fatalf("%d events stored of %d: the one the full disk lost is missing", len(evs), len(log))
	}
	got, err := s.Turn(ctx, "t1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.ToolCalls) != 2 || got.ToolCalls[0].Result != big.Result {
		t.Fatalf("call records: %d", len(got.ToolCalls))
	}
}

// openImpatient opens the store at path with a busy timeout of 50ms, so
// that a lock another process holds makes its writes fail (and be tried
// again) at once.
func openImpatient(t *testing.T, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(path, sqlite.Options{BusyTimeout: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// lockFile takes the write lock of the store at path, as another process
// would, until unlock is called (or the test ends).
func lockFile(t *testing.T, path string) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	other, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	lock, err := other.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lock.Close() })
	if _, err := lock.ExecContext(ctx, "BEGIN EXCLUSIVE"); err != nil {
		t.Fatal(err)
	}
	return func() {
		if _, err := lock.ExecContext(ctx, "COMMIT"); err != nil {
			t.Fatal(err)
		}
	}
}

// TestALockedFileLosesNothing: while another process holds the file's
// write lock past BusyTimeout, the turn's events are kept and committed
// again, the store says it is behind, and the turn's end is stored once
// the lock is let go — nothing fails, nothing is lost.
func TestALockedFileLosesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	s := openImpatient(t, path)
	defer s.Close()
	ctx := context.Background()
	rec := store.NewRecorder(s)
	if err := rec.Begin(ctx, store.TurnStart{TurnID: "t1", Input: "q", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	em := event.NewEmitter("t1", rec)
	em.Emit(&event.TurnStarted{Input: "q"})
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	unlock := lockFile(t, path)
	for range 100 {
		em.Emit(&event.LLMDelta{Text: "x"})
	}
	em.Emit(&event.TurnFinished{Status: budget.StatusCompleted, StopReason: budget.Answered, Answer: "a"})
	end := &event.Turn{TurnID: "t1", Input: "q", Status: budget.StatusCompleted, StopReason: budget.Answered, Answer: "a",
		StartedAt: time.Now(), EndedAt: time.Now(), Events: em.Log()}
	late := make(chan error, 1)
	go func() {
		late <- s.UpdateToolCall(ctx, event.ToolCall{TurnID: "t1", CallID: "c1", Tool: "slow", Outcome: event.OutcomeAbandoned,
			LateResult: true, LateOutput: "finally"})
	}()
	finished := make(chan error, 1)
	go func() { finished <- rec.Finish(ctx, end, nil) }()

	deadline := time.Now().Add(10 * time.Second)
	for !s.Backlog().Behind() {
		if time.Now().After(deadline) {
			t.Fatalf("locked for 10s, the store is not behind: %+v", s.Backlog())
		}
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case err := <-finished:
		t.Fatalf("the turn's end returned while the file was locked: %v", err)
	case err := <-late:
		t.Fatalf("a late result returned while the file was locked: %v", err)
	case <-time.After(300 * time.Millisecond): // several busy timeouts
	}
	unlock()
	if err := <-late; err != nil {
		t.Fatalf("the late result: %v", err)
	}
	if err := <-finished; err != nil {
		t.Fatalf("the turn's end: %v", err)
	}
	got, err := s.Turn(ctx, "t1")
	if err != nil || got.Status != budget.StatusCompleted || got.Answer != "a" {
		t.Fatalf("stored %+v, %v", got, err)
	}
	evs, err := s.Events(ctx, "t1", 0, 0)
	if err != nil || len(evs) != len(em.Log()) {
		t.Fatalf("%d events stored of %d (%v)", len(evs), len(em.Log()), err)
	}
	if b := s.Backlog(); b.Behind() || b.Events != 0 {
		t.Errorf("backlog after: %+v", b)
	}
}

// TestEndsWaitInTheQueue: turns' ends are queued behind their events and
// committed by the writer with whatever else waits, in its groups, not
// each in a transaction of its own (issue 29: 10,000 ends at once took
// 11 s one after the other). While another process holds the file's lock
// the ends wait in the queue — the backlog counts them — and once it is
// let go each is stored whole.
func TestEndsWaitInTheQueue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	s := openImpatient(t, path)
	defer s.Close()
	ctx := context.Background()
	ids := []string{"e1", "e2", "e3"}
	for _, id := range ids {
		if err := s.BeginTurn(ctx, store.TurnStart{TurnID: id, SessionID: "s" + id, Input: "q", StartedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	unlock := lockFile(t, path)
	finished := make(chan error, len(ids))
	for _, id := range ids {
		go func() {
			now := time.Now()
			finished <- s.FinishTurn(ctx, &event.Turn{TurnID: id, SessionID: "s" + id, Input: "q", Status: budget.StatusCompleted,
				StopReason: budget.Answered, Answer: "a " + id, StartedAt: now, EndedAt: now},
				[]model.Message{{Role: model.RoleUser, Content: "q"}, {Role: model.RoleAssistant, Content: "a " + id}})
		}()
	}
	if !wait.Until(10*time.Second, func() bool { return s.Backlog().Events == len(ids) }) {
		t.Fatalf("the file locked, the backlog is %+v: want the %d ends queued", s.Backlog(), len(ids))
	}
	unlock()
	for range ids {
		if err := <-finished; err != nil {
			t.Fatalf("an end: %v", err)
		}
	}
	for _, id := range ids {
		got, err := s.Turn(ctx, id)
		if err != nil || got.Status != budget.StatusCompleted || got.Answer != "a "+id {
			t.Fatalf("turn %s stored as %+v, %v", id, got, err)
		}
		msgs, err := s.History(ctx, "s"+id)
		if err != nil || len(msgs) != 2 || msgs[1].Content != "a "+id {
			t.Fatalf("session s%s stored %+v, %v", id, msgs, err)
		}
	}
}

// TestAnEndOutlivesItsContext: a FinishTurn whose context ends while its
// end waits in the queue (the file locked) returns the context's error at
// once, and the end stays queued: it is stored once the lock is let go.
func TestAnEndOutlivesItsContext(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	s := openImpatient(t, path)
	defer s.Close()
	ctx := context.Background()
	if err := s.BeginTurn(ctx, store.TurnStart{TurnID: "c1", SessionID: "sc1", Input: "q", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	unlock := lockFile(t, path)
	short, cancel := context.WithCancel(ctx)
	finished := make(chan error, 1)
	go func() {
		now := time.Now()
		finished <- s.FinishTurn(short, &event.Turn{TurnID: "c1", SessionID: "sc1", Input: "q", Status: budget.StatusCompleted,
			StopReason: budget.Answered, Answer: "a", StartedAt: now, EndedAt: now}, nil)
	}()
	if !wait.Until(10*time.Second, func() bool { return s.Backlog().Events == 1 }) {
		t.Fatalf("the file locked, the backlog is %+v: want the end queued", s.Backlog())
	}
	cancel()
	select {
	case err := <-finished:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("FinishTurn after its context ended: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		unlock()
		t.Fatal("FinishTurn did not return when its context ended")
	}
	unlock()
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := s.Turn(ctx, "c1")
	if err != nil || got.Status != budget.StatusCompleted || got.Answer != "a" {
		t.Fatalf("turn c1 stored as %+v, %v: want its end, stored after its context ended", got, err)
	}
}

// TestLongAnswerStoredOnce: a turn's long answer is stored once, in pieces
// of at most 256 KiB, and its turn_finished event, record, message and
// session message name it instead of holding a copy (issue 29: SQLite
// had the whole answer bound five more times at the turn's end).
func TestLongAnswerStoredOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	s := open(t, path)
	_, msgs := storetest.LongTurn(t, s, "l1", "ls")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	storetest.StoredOnce(t, msgs, "length(CAST(%s AS BLOB))", func(q string) store.Rows {
		rows, err := db.Query(q)
		if err != nil {
			t.Fatal(err)
		}
		return rows
	})

	// `timebox runs` reads it through a read-only store.
	ro, err := sqlite.OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	rec, err := ro.Turn(context.Background(), "l1")
	if err != nil || rec.Answer != storetest.LongAnswer || rec.Message != storetest.LongAnswer {
		t.Fatalf("read-only: %v", err)
	}
}

// TestReadOnlyReadsSchema5: a store written before long texts were kept
// apart (schema version 5, no apart columns) is read as it was.
func TestReadOnlyReadsSchema5(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timebox.db")
	s := open(t, path)
	storetest.LongTurn(t, s, "l1", "ls")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	// Turn 2 is written as version 5 wrote it: inline, then the columns go.
	for _, q := range []string{
		`INSERT INTO turns (turn_id, session_id, agent, input, status, stop_reason, message, started_at, ended_at, record)
			VALUES ('v5', 'ls', 'test', 'hi', 'completed', 'answered', 'inline', 1, 2,
			'{"turn_id":"v5","status":"completed","stop_reason":"answered","message":"inline","answer":"inline"}')`,
		`INSERT INTO events (turn_id, seq, type, at, data) VALUES ('v5', 1, 'turn_finished', 2,
			'{"seq":1,"turn_id":"v5","type":"turn_finished","at":"2025-01-01T00:00:00Z","answer":"inline","message":"inline"}')`,
		`INSERT INTO messages (session_id, turn_id, message) VALUES ('ls', 'v5', '{"role":"assistant","content":"inline"}')`,
		`DROP TABLE texts`,
		`ALTER TABLE events DROP COLUMN apart`,
		`ALTER TABLE turns DROP COLUMN apart`,
		`ALTER TABLE messages DROP COLUMN apart`,
		`PRAGMA user_version = 5`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()
	ro, err := sqlite.OpenReadOnly(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	ctx := context.Background()
	rec, err := ro.Turn(ctx, "v5")
	if err != nil || rec.Answer != "inline" {
		t.Fatalf("record %+v, %v", rec, err)
	}
	ev, err := ro.Events(ctx, "v5", 0, 0)
	if err != nil || len(ev) != 1 || ev[0].Data.(*event.TurnFinished).Answer != "inline" {
		t.Fatalf("events %+v, %v", ev, err)
	}
	list, err := ro.Turns(ctx, store.Filter{SessionID: "ls"})
	if err != nil || len(list) != 2 || list[0].Message != "inline" {
		t.Fatalf("list %+v, %v", list, err)
	}
	if h, err := ro.History(ctx, "ls"); err != nil || h[len(h)-1].Content != "inline" {
		t.Fatalf("history %v", err)
	}
}
