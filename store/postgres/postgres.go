// Package postgres is the store that several gateways share: one
// PostgreSQL database (github.com/jackc/pgx/v5 and its pool) holding what
// the SQLite store holds, so that a turn started through one `timebox
// serve` is listed, followed live, resumed and cancelled through any other
// (spec §13, docs/decisions/many-gateways.md).
//
//   - Writes are as in SQLite: events queued and committed in groups by one
//     writer (group commit), every other write committed before its method
//     returns.
//   - Live: every commit of events sends NOTIFY timebox_events with the
//     turn's id; each store LISTENs on its own connection and wakes the
//     turn's watchers (Watch), who read the new events from the table. The
//     table is the source of truth: watchers are also woken every
//     Options.Poll, so a notification that never arrives costs latency,
//     never an event.
//   - Cancel: a request is a row in cancel_requests and a NOTIFY
//     timebox_cancel; the gateway running the turn cancels it on the
//     notification, or finds the row at its next poll.
//   - Ownership: each store is an owner (a row with a heartbeat on the
//     database's clock); each turn records its owner. A store whose
//     heartbeat is older than three of its own intervals is gone: the
//     first live store to claim it (deleting its row, in the same
//     transaction as the interruptions) marks its running turns
//     interrupted — exactly once, however many race for it.
//   - Migrations are versioned (timebox_schema) and applied at Open in one
//     transaction under an advisory lock.
package postgres

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/internal/groupq"
	"github.com/timebox-run/timebox/store/internal/retry"
	"github.com/timebox-run/timebox/store/internal/watch"
)

// Options tune a Store. The zero value is what `timebox serve` uses.
type Options struct {
	// Heartbeat is how often the store tells the others sharing the
	// database that it is alive, and looks for stores that are gone. A
	// store silent for three of its own heartbeats is taken for gone, and
	// its running turns are marked interrupted. Zero is 5s.
	Heartbeat time.Duration
	// Poll is how often watchers (Watch) and running turns (WatchCancel)
	// look at the tables again, should a notification have been missed.
	// Zero is 1s.
	Poll time.Duration
	// Logger gets a line for each gone store whose turns this one marked
	// interrupted, and for each lost LISTEN connection; nil discards them.
	Logger *slog.Logger
	// Ended, when set, is told of each turn the store ends from outside
	// its process (its gateway is gone, or store.Interrupter), once that
	// is committed — at Open too. It is called on the store's own
	// goroutines: it must not wait on the store.
	Ended func(store.Ending)
}

// Heartbeats is how many heartbeats of its own a store may miss before
// another takes it for gone.
const Heartbeats = 3

// DefaultHeartbeat is a store's heartbeat unless Options or the URL's
// timebox_heartbeat sets another.
const DefaultHeartbeat = 5 * time.Second

// GoneWindow returns how long after a store with heartbeat hb dies another
// store, watching with the same heartbeat, takes it for gone: at the
// earliest Heartbeats-1 of them (it died just before its next beat), at
// the latest Heartbeats+1 (it died just after one, and the watcher had
// looked just before the silence was long enough). With the default
// heartbeat, 10 to 20 seconds.
func GoneWindow(hb time.Duration) (earliest, latest time.Duration) {
	return (Heartbeats - 1) * hb, (Heartbeats + 1) * hb
}

// Store is a store.Store in a PostgreSQL database. It is safe for
// concurrent use.
type Store struct {
	where   string // the database, for messages (no password)
	pool    *pgxpool.Pool
	connCfg *pgx.ConnConfig // for the LISTEN connection
	// probeCfg is for the connection that asks whether the database
	// answers while a wait is under way (prober).
	probeCfg *pgx.ConnConfig
	live     *liveness
	owner    string
	host     string
	hb       time.Duration
	poll     time.Duration
	log      *slog.Logger
	ended    func(store.Ending) // Options.Ended

	recovered []string

	// unbegunIDs are turns whose BeginTurn failed with its COMMIT sent and
	// not answered (unbegun, endUnbegun).
	unbegunMu  sync.Mutex
	unbegunIDs map[string]bool

	// upSince is when, on the database's clock, this store began to see
	// the database without a failed heartbeat or a gap between two
	// (seen); beatOnce, that it has beaten once.
	upMu     sync.Mutex
	upSince  time.Time
	beatOnce bool

	q       *groupq.Queue
	watch   watch.Set // followers of turns (Watch)
	cancels watch.Set // turns this store runs (WatchCancel)

	dropNotify atomic.Bool // tests: act as if every notification were lost
	// loseAnswers, in tests, is how many commits of numbered groups end
	// as if the connection was cut as they committed: stored, answered by
	// an error.
	loseAnswers atomic.Int32
	// loseDurable, in tests, is how many commits of durable writes end
	// so.
	loseDurable atomic.Int32

	ctx       context.Context // ends when the store closes
	stopAll   context.CancelFunc
	bg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
	closed    chan struct{}
	// ending counts the ends under way (FinishTurn, durable writes),
	// which Close lets finish before it closes.
	ending ending
}

// ending counts writes under way; wait returns once there are none.
type ending struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0, for a wait
}

func (e *ending) begin() {
	e.mu.Lock()
	e.n++
	e.mu.Unlock()
}

func (e *ending) end() {
	e.mu.Lock()
	e.n--
	if e.n == 0 && e.idle != nil {
		close(e.idle)
		e.idle = nil
	}
	e.mu.Unlock()
}

// wait returns once no write is under way, or after d; it reports
// whether none is.
func (e *ending) wait(d time.Duration) bool {
	e.mu.Lock()
	if e.n == 0 {
		e.mu.Unlock()
		return true
	}
	if e.idle == nil {
		e.idle = make(chan struct{})
	}
	idle := e.idle
	e.mu.Unlock()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-idle:
		return true
	case <-t.C:
		return false
	}
}

const (
	// maxGroup bounds how many event appends share one transaction.
	maxGroup = 1024
	// defaultMaxConns is the pool size when the URL does not set
	// pool_max_conns: the writer, the LISTEN connection apart, and readers
	// for the followers.
	defaultMaxConns = 10
)

var _ store.Store = (*Store)(nil)

// Open connects to the database dsn (a postgres:// URL or key=value
// string, see IsURL; a URL of another scheme is an error; pgx's parameters
// apply, pool_max_conns sizes the pool, default 10, and HeartbeatParam
// sets the heartbeat), migrates it to
// SchemaVersion, registers this store as an owner, marks interrupted the
// running turns of owners already gone (Recovered lists them), and starts
// listening for notifications. It returns an error if the database cannot
// be reached, is not UTF-8, or was made by a newer timebox. Errors never
// show the password.
func Open(ctx context.Context, dsn string, o Options) (*Store, error) {
	where := Redact(dsn)
	if scheme, ok := urlScheme(dsn); ok {
		if !isPostgresURL(dsn) {
			return nil, fmt.Errorf("postgres: %s: timebox stores turns in PostgreSQL (a postgres:// URL or a key=value connection string) or in a SQLite file (its path), not in a %s:// database", where, scheme)
		}
		// pgx reads only the lower-case schemes as URLs.
		dsn = strings.ToLower(scheme) + dsn[len(scheme):]
	}
	dsn, hb, err := takeHeartbeat(dsn)
	if err != nil {
		return nil, fmt.Errorf("postgres: %s: %w", where, err)
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = hb
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = DefaultHeartbeat
	}
	if o.Poll <= 0 {
		o.Poll = time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, parseError(where, err)
	}
	if !hasParam(dsn, "pool_max_conns") {
		cfg.MaxConns = defaultMaxConns
	}
	_, named := cfg.ConnConfig.RuntimeParams["application_name"]
	if !named {
		cfg.ConnConfig.RuntimeParams["application_name"] = "timebox"
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres: %s: %w", where, err)
	}
	fail := func(err error) (*Store, error) {
		pool.Close()
		if fix := connectFix(err, cfg.ConnConfig.Host, cfg.ConnConfig.User, cfg.ConnConfig.Database); fix != "" {
			return nil, fmt.Errorf("opening store %s: %w; %s", where, err, fix)
		}
		return nil, fmt.Errorf("opening store %s: %w", where, err)
	}
	var enc string
	if err := pool.QueryRow(ctx, `SHOW server_encoding`).Scan(&enc); err != nil {
		return fail(err)
	}
	if enc != "UTF8" && enc != "SQL_ASCII" {
		return fail(fmt.Errorf("the database's encoding is %s: timebox stores UTF-8 text (create it with createdb -E UTF8)", enc))
	}
	if err := migrate(ctx, pool, where); err != nil {
		return fail(err)
	}
	host, _ := os.Hostname()
	owner := newID()
	listenCfg := cfg.ConnConfig.Copy()
	if !named {
		// So that pg_stat_activity tells the LISTEN connection of each
		// gateway from the pools.
		listenCfg.RuntimeParams["application_name"] = "timebox listen " + owner
	}
	probeCfg := cfg.ConnConfig.Copy()
	if !named {
		probeCfg.RuntimeParams["application_name"] = "timebox probe " + owner
	}
	s := &Store{where: where, pool: pool, connCfg: listenCfg, probeCfg: probeCfg, live: newLiveness(time.Now), owner: owner, host: host,
		hb: o.Heartbeat, poll: o.Poll, log: o.Logger, ended: o.Ended, closed: make(chan struct{})}
	s.ctx, s.stopAll = context.WithCancel(context.Background())
	if err := s.beat(ctx); err != nil {
		s.stopAll()
		return fail(err)
	}
	// Listen before anything can be watched, so that Open returns a store
	// that is live.
	conn, err := s.listenConn(ctx)
	if err != nil {
		s.stopAll()
		return fail(fmt.Errorf("LISTEN: %w", err))
	}
	if s.recovered, err = s.recover(ctx); err != nil {
		conn.Close(context.Background())
		s.stopAll()
		return fail(fmt.Errorf("marking interrupted turns: %w", err))
	}
	s.q = groupq.New(s.commitGroup, groupq.Options{MaxGroup: maxGroup, Transient: transient, Encode: store.EncodeEvent,
		OnState: groupq.Log(s.log, "postgres store "+s.where)})
	s.bg.Add(4)
	go s.listen(conn)
	go s.heartbeat()
	go s.poller()
	go s.prober()
	return s, nil
}

// HeartbeatParam is the parameter of a database URL that sets
// Options.Heartbeat when it is zero ("timebox_heartbeat=2s"), so that
// `timebox serve --db URL` can be tuned without a flag of its own. It is
// removed from the URL before it is given to pgx.
const HeartbeatParam = "timebox_heartbeat"

// takeHeartbeat removes HeartbeatParam from dsn and returns its value (0
// when absent; the last, as pgx reads a key given twice).
func takeHeartbeat(dsn string) (string, time.Duration, error) {
	var v string
	if isKeyValue(dsn) {
		pairs, _ := keyValuePairs(dsn) // pgx says what is wrong with the rest
		found := false
		for i := len(pairs) - 1; i >= 0; i-- {
			p := pairs[i]
			if p.key != HeartbeatParam {
				continue
			}
			if !found {
				v, found = p.value, true
			}
			dsn = dsn[:p.start] + dsn[p.end:]
		}
		if !found {
			return dsn, 0, nil
		}
		dsn = strings.TrimSpace(dsn)
	} else {
		u, err := url.Parse(dsn)
		if err != nil || !u.Query().Has(HeartbeatParam) {
			return dsn, 0, nil // pgx says what is wrong with a bad URL
		}
		q := u.Query()
		v = q[HeartbeatParam][len(q[HeartbeatParam])-1]
		q.Del(HeartbeatParam)
		u.RawQuery = q.Encode()
		dsn = u.String()
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 10*time.Millisecond {
		return "", 0, fmt.Errorf("%s=%q: want a duration of at least 10ms, such as 5s", HeartbeatParam, v)
	}
	return dsn, d, nil
}

// hasParam reports whether dsn, a URL or key=value string, sets key.
func hasParam(dsn, key string) bool {
	if isKeyValue(dsn) {
		pairs, _ := keyValuePairs(dsn)
		return slices.ContainsFunc(pairs, func(p kvPair) bool { return p.key == key })
	}
	u, err := url.Parse(dsn)
	return err == nil && u.Query().Has(key)
}

func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// Owner returns the id this store is known by to the others sharing the
// database (the owner of the turns it begins).
func (s *Store) Owner() string { return s.owner }

// Where returns the database the store is in, fit to print (Redact).
func (s *Store) Where() string { return s.where }

// Recovered returns the ids of the turns Open marked interrupted.
func (s *Store) Recovered() []string { return append([]string(nil), s.recovered...) }

func (s *Store) isClosed() bool {
	select {
	case <-s.closed:
		return true
	default:
		return false
	}
}

// Close stores the queued events, marks this store's running turns
// interrupted, removes it as an owner and closes the pool. It is
// idempotent and safe for concurrent use; methods called after it return
// store.ErrClosed.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		// The ends under way are let finish first, the queue with them (a
		// FinishTurn waits for its turn's events): closed at once, a
		// turn's end that waited for the database was refused while its
		// turn_finished, queued, was stored, and the turn was then marked
		// interrupted. The 30 s are for both.
		start := time.Now()
		if !s.ending.wait(closeWithin) {
			s.log.Warn("postgres store: closing with turn ends not stored", "db", s.where)
		}
		close(s.closed)
		s.q.CloseWithin(closeWithin - time.Since(start))
		s.stopAll()
		s.bg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := s.interruptOwner(ctx, s.owner, "the store was closed while the turn was running", nil)
		if err == nil {
			_, err = s.pool.Exec(ctx, `DELETE FROM owners WHERE owner_id = $1`, s.owner)
		}
		s.pool.Close()
		s.closeErr = err
	})
	return s.closeErr
}

// Ping reports whether the database answers (for /healthz).
func (s *Store) Ping(ctx context.Context) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	return s.pool.Ping(ctx)
}

// crash stops s as a killed process would: no turn marked, no owner
// removed, its heartbeats stopped.
func (s *Store) crash() {
	s.closeOnce.Do(func() {
		close(s.closed)
		s.q.Close()
		s.stopAll()
		s.bg.Wait()
		s.pool.Close()
	})
}

// closeWithin bounds how long Close goes on storing what is under way
// while the database is away.
const closeWithin = 30 * time.Second

// tx runs fn in a transaction.
func (s *Store) tx(ctx context.Context, fn func(pgx.Tx) error) error {
	if s.isClosed() {
		return store.ErrClosed
	}
	return pgx.BeginFunc(ctx, s.pool, fn)
}

// durable runs fn in a transaction until it commits: again, after a
// backoff, while it fails for a reason that passes (transient: the
// database is away, a connection was cut), until ctx ends or the store is
// closed. The writes that must reach the store whatever happens meanwhile
// — a turn's end, a late result, a conversation — go through it; what
// says "stored" to nobody yet (beginning a turn, a cancel request) fails
// at once instead.
func (s *Store) durable(ctx context.Context, what string, fn func(pgx.Tx) error) error {
	return s.durableAfter(ctx, what, nil, fn)
}

// durableAfter is durable with a step before each try of the transaction
// (nil: none), such as storing a long text's pieces on their own
// (prestore), whose failures are retried the same way.
func (s *Store) durableAfter(ctx context.Context, what string, before func() error, fn func(pgx.Tx) error) error {
	s.ending.begin()
	defer s.ending.end()
	return retry.Do(ctx, retry.Policy{Transient: transient, Stop: s.closed, Log: s.log, What: "postgres store: " + what, Attrs: []any{"db", s.where},
		Stopped: func(err error) error {
			return fmt.Errorf("%w while %s could not be stored: %w", store.ErrClosed, what, err)
		}}, func() error {
		if before != nil {
			if err := before(); err != nil {
				return err
			}
		}
		err := s.tx(ctx, fn)
		if err == nil && s.loseDurable.Load() > 0 && s.loseDurable.Add(-1) >= 0 {
			err = fmt.Errorf("committing: %w", io.ErrUnexpectedEOF)
		}
		return err
	})
}

func nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }

// text makes s fit a text column: PostgreSQL's text cannot hold NUL,
// which a user's input may. The JSON records keep the exact value.
func text(s string) string { return strings.ReplaceAll(s, "\x00", "\uFFFD") }

var errNoRows = pgx.ErrNoRows

func isNoRows(err error) bool { return errors.Is(err, errNoRows) }
