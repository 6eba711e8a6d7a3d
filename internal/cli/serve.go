package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/internal/proctree"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/postgres"
	"github.com/timebox-run/timebox/telemetry"
	"github.com/timebox-run/timebox/temporal"
)

// Defaults of the serve and store flags.
const (
	defaultAddr = "127.0.0.1:8080"
	defaultDB   = "timebox.db"
)

// setting returns a flag's value when it was given, else the environment
// variable's when it is set and not empty, else def.
func setting(fs *flag.FlagSet, name, value, env string, o IO, def string) string {
	v, _ := settingFrom(fs, name, value, env, o, def)
	return v
}

// settingFrom is setting, and says where the value came from, for an error
// about it: "--name", the variable's name, or "the default".
func settingFrom(fs *flag.FlagSet, name, value, env string, o IO, def string) (v, from string) {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	if set {
		return value, "--" + name
	}
	if v := o.getenv(env); v != "" {
		return v, env
	}
	return def, "the default"
}

// listen listens on addr, which from gave ("--addr", "TIMEBOX_ADDR" or
// "the default"). An address another process holds, or a port the system
// keeps for privileged processes, is said in words with the fix: the
// system's "bind: address already in use" names neither the flag nor what
// to do.
func listen(addr, from string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err == nil {
		return ln, nil
	}
	host, port, _ := net.SplitHostPort(addr)
	switch {
	case errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.Errno(10048)): // WSAEADDRINUSE
		other := net.JoinHostPort(host, "0")
		if n, perr := strconv.Atoi(port); perr == nil && n > 0 && n < 65535 {
			other = net.JoinHostPort(host, strconv.Itoa(n+1))
		}
		return nil, fmt.Errorf("%s (from %s) is already in use by another process; stop that process, or listen on another port, such as --addr %s", addr, from, other)
	case errors.Is(err, os.ErrPermission):
		return nil, fmt.Errorf("%s (from %s): this process may not listen on port %s (ports below 1024 need privileges); listen on a higher port, such as --addr %s", addr, from, port, net.JoinHostPort(host, "8080"))
	}
	return nil, err
}

// serveToken returns the bearer token from --token, else TIMEBOX_TOKEN. A
// token that was given must be one a client can send: an empty or blank
// one is refused rather than taken as "no token", which would serve
// without one while the person believes otherwise. A short one is served
// with a warning.
func serveToken(fs *flag.FlagSet, flagValue string, o IO) (string, bool) {
	name, token, given := "--token", flagValue, false
	fs.Visit(func(f *flag.Flag) { given = given || f.Name == "token" })
	if !given {
		name = "TIMEBOX_TOKEN"
		token, given = o.lookupEnv(name)
	}
	if !given {
		return "", true
	}
	warning, err := server.CheckToken(token)
	if err != nil {
		fmt.Fprintf(o.Err, "timebox serve: %s %v\n", name, err)
		return "", false
	}
	if warning != "" {
		fmt.Fprintf(o.Err, "warning: %s %s\n", name, warning)
	}
	return token, true
}

func cmdServe(ctx context.Context, args []string, o IO) int {
	fs, c := newFlags("serve", o)
	addrFlag := fs.String("addr", "", "the address to serve on (env TIMEBOX_ADDR; default "+defaultAddr+"); a non-loopback address needs a token")
	dbFlag := fs.String("db", "", `the store: a SQLite file, or a postgres:// URL that several gateways share (env TIMEBOX_DB; default `+stateDB(o)+`); "" keeps turns in memory only`)
	tokenFlag := fs.String("token", "", "require \"Authorization: Bearer TOKEN\" on the API and /metrics (env TIMEBOX_TOKEN, which ps does not show)")
	ef := addEngineFlags(fs, true, false)
	pos, err := parse(fs, args)
	if err != nil {
		return usageExit(err)
	}
	es, err := ef.resolve(fs, o)
	if err != nil {
		fmt.Fprintln(o.Err, "timebox serve:", err)
		return ExitUsage
	}
	if len(pos) > 0 {
		fmt.Fprintf(o.Err, "timebox serve: unexpected argument %q (the file is given with -f)\n", pos[0])
		return ExitUsage
	}
	addr, addrFrom := settingFrom(fs, "addr", *addrFlag, "TIMEBOX_ADDR", o, defaultAddr)
	db := setting(fs, "db", *dbFlag, "TIMEBOX_DB", o, stateDB(o))
	if es.Engine == engineTemporal && !postgres.IsURL(db) {
		fmt.Fprintln(o.Err, "timebox serve: --engine temporal needs the PostgreSQL store its workers write to: --db postgres://… (or TIMEBOX_DB)")
		return ExitUsage
	}
	token, ok := serveToken(fs, *tokenFlag, o)
	if !ok {
		return ExitUsage
	}
	if err := server.CheckAddr(addr, token); err != nil {
		fmt.Fprintf(o.Err, "timebox serve: %s: %v\n", addrFrom, err)
		return ExitUsage
	}
	cfg, ok := loadConfig(c, fs, o)
	if !ok {
		return ExitUsage
	}
	hooks, err := serverWebhooks(cfg, o)
	if err != nil {
		fmt.Fprintln(o.Err, err)
		fmt.Fprintln(o.Err, "timebox serve: the webhooks need their secrets; nothing was started.")
		return ExitUsage
	}
	if err := server.CheckWebhooks(hooks, addr); err != nil {
		fmt.Fprintln(o.Err, "timebox serve:", err)
		return ExitUsage
	}
	reapOrphans(o)

	tracing, st, closeStore, code := openTracedStore(ctx, db, true, o, "timebox serve")
	if code != ExitOK {
		return code
	}
	defer closeStore()

	// Late results reach the server through each turn's sink.
	if es.Engine != engineTemporal { // there, the workers call the models
		if err := timebox.NoCredential(cfg, o.getenv); err != nil {
			fmt.Fprintln(o.Err, "timebox serve:", err)
			return ExitUsage
		}
	}
	a, err := timebox.Build(ctx, cfg, timebox.Options{Getenv: o.getenv, TracerProvider: tracing.Provider})
	if err != nil {
		fmt.Fprintln(o.Err, "timebox:", err)
		return ExitUsage
	}
	defer a.Close()

	ln, err := listen(addr, addrFrom)
	if err != nil {
		fmt.Fprintf(o.Err, "timebox serve: %v\n", err)
		return ExitFailed
	}
	var runner server.Runner = a
	if es.Engine == engineTemporal {
		tc, err := es.dial(ctx, o)
		if err != nil {
			ln.Close()
			fmt.Fprintln(o.Err, "timebox serve:", err)
			return ExitFailed
		}
		defer tc.Close()
		if runner, err = temporal.NewRunner(tc, st, es.TaskQueue, a.Agent); err != nil {
			ln.Close()
			fmt.Fprintln(o.Err, "timebox serve:", err)
			return ExitFailed
		}
	}
	s, err := server.New(server.Config{Agent: runner, AgentName: cfg.Name, Store: st, Token: token,
		ShutdownGrace: cfg.Server.ShutdownGrace.D, Logger: slog.New(slog.NewTextHandler(o.Err, nil)),
		Webhooks: hooks,
		Budgets:  a.Agent}) // the budgets GET /v1/stats compares the calls with, whatever engine runs the turns
	if err != nil {
		ln.Close()
		fmt.Fprintln(o.Err, "timebox serve:", err)
		return ExitFailed
	}

	where := storeName(db) // never a password
	name := cfg.Name
	if name == "" {
		name = c.file
	}
	// The signals are caught before the address is printed: whoever reads
	// it may stop the server at once, and must get a graceful stop.
	ctx, stop := shutdownSignals(ctx, s, cfg.Server.ShutdownGrace.String(), o)
	defer stop()
	if es.Engine == engineTemporal {
		where += fmt.Sprintf("; turns run on Temporal at %s, task queue %s", es.Address, es.TaskQueue)
	}
	fmt.Fprintf(o.Out, "timebox serving %s on http://%s (store: %s)\n", name, ln.Addr(), where)
	if token == "" {
		fmt.Fprintln(o.Out, "no token: only this machine can reach it (set --token or TIMEBOX_TOKEN to serve others)")
	}
	if err := s.Serve(ctx, ln); err != nil {
		fmt.Fprintln(o.Err, "timebox serve:", err)
		return ExitFailed
	}
	fmt.Fprintln(o.Err, "timebox serve: stopped; every record is stored")
	return ExitOK
}

// shutdownSignals returns a context that ends at the first SIGINT or
// SIGTERM, which starts the server's graceful shutdown; a second one ends
// the grace at once (running turns are cancelled with shutdown, and still
// stored).
func shutdownSignals(ctx context.Context, s *server.Server, grace string, o IO) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		n := 0
		for {
			select {
			case <-sig:
				n++
				if n == 1 {
					fmt.Fprintf(o.Err, "\ntimebox serve: shutting down; running turns (%d) get %s (server.shutdown_grace); send it again to cancel them now\n",
						s.Running(), grace)
					cancel()
					continue
				}
				fmt.Fprintln(o.Err, "timebox serve: cancelling running turns now")
				s.EndGrace()
			case <-done:
				return
			}
		}
	}()
	return ctx, func() {
		signal.Stop(sig)
		close(done)
		cancel()
	}
}

// reapOrphans stops the tool processes that a timebox process which died
// (SIGKILL, a crash) left running, before this one runs anything, and says
// how many on stderr. Their turns are marked interrupted when the store
// opens.
func reapOrphans(o IO) {
	r, err := proctree.ReapOrphans()
	if err != nil {
		fmt.Fprintf(o.Err, "timebox: looking for tool processes a stopped timebox left running: %v\n", err)
	}
	if r.Processes == 0 {
		return
	}
	pids := make([]string, len(r.Owners))
	for i, p := range r.Owners {
		pids[i] = strconv.Itoa(p)
	}
	msg := fmt.Sprintf("timebox: stopped %d tool process%s left running by timebox (pid %s), which stopped without stopping %s",
		r.Processes, map[bool]string{true: "", false: "es"}[r.Processes == 1], strings.Join(pids, ", "),
		map[bool]string{true: "it", false: "them"}[r.Processes == 1])
	if r.Unkilled > 0 {
		msg += fmt.Sprintf("; %d had not exited 5s after SIGKILL (uninterruptible sleep) and will when the kernel lets %s go",
			r.Unkilled, map[bool]string{true: "it", false: "them"}[r.Unkilled == 1])
	}
	fmt.Fprintln(o.Err, msg)
}

// openTracedStore starts tracing (startTracing) and opens the store at
// db (openStore, memoryOK as there) with the turns it ends from outside
// traced (tracedEnds). Tracing first: the turns the store finds its dead
// owners left have their spans made, and the store closes before tracing
// stops, which closeStore does in that order. On failure, with nothing
// left open, the error is printed after cmd and code is what the command
// exits with: ExitUsage for a tracing setting that cannot be used,
// ExitFailed for a store that does not open; ExitOK otherwise.
func openTracedStore(ctx context.Context, db string, memoryOK bool, o IO, cmd string) (tracing *telemetry.Tracing, st store.Store, closeStore func(), code int) {
	tracing, ok := startTracing(ctx, o)
	if !ok {
		return nil, nil, nil, ExitUsage
	}
	st, err := openStore(db, memoryOK, o, tracedEnds(tracing))
	if err != nil {
		fmt.Fprintln(o.Err, cmd+":", err)
		stopTracing(tracing, o)
		return nil, nil, nil, ExitFailed
	}
	return tracing, st, func() { st.Close(); stopTracing(tracing, o) }, ExitOK
}

// openStore opens the store at path: a postgres:// URL is a PostgreSQL
// database that several gateways may share, anything else a SQLite file
// ("sqlite:" may lead it); "" is an in-memory store when memoryOK, an
// error otherwise. It reports the turns it marked interrupted. ended, if
// not nil, is told of each turn the store ends from outside its process
// (tracedEnds).
func openStore(path string, memoryOK bool, o IO, ended func(store.Ending)) (store.Store, error) {
	if path == "" {
		if memoryOK {
			return store.NewMemory(), nil
		}
		return nil, errors.New(`no store: --db is ""`)
	}
	var (
		st  store.Store
		ids []string
	)
	if postgres.IsURL(path) {
		pg, err := openPostgres(path, o, ended)
		if err != nil {
			return nil, err
		}
		st, ids = pg, pg.Recovered()
	} else {
		// The default store's directory (~/.local/state/timebox) may not
		// exist yet.
		if err := os.MkdirAll(filepath.Dir(sqlitePath(path)), 0o700); err != nil {
			return nil, fmt.Errorf("opening the store: %w", err)
		}
		lite, err := openSQLite(sqlitePath(path), ended)
		if err != nil {
			return nil, err
		}
		st, ids = lite, lite.Recovered()
	}
	if len(ids) > 0 {
		fmt.Fprintf(o.Err, "timebox: marked %d turn%s interrupted: the process running %s stopped before %s ended (%s)\n",
			len(ids), plural(len(ids)), map[bool]string{true: "it", false: "them"}[len(ids) == 1],
			map[bool]string{true: "it", false: "they"}[len(ids) == 1], strings.Join(ids, ", "))
	}
	return st, nil
}

// sqlitePath returns the file a --db value that is not a URL names: the
// value without a leading "sqlite:".
func sqlitePath(db string) string { return strings.TrimPrefix(db, "sqlite:") }

// openPostgres opens the PostgreSQL store at url, with the heartbeat its
// timebox_heartbeat parameter sets, if any (postgres.ParseURL). Its log
// lines (a gateway taken for gone, a lost LISTEN connection) go to stderr.
func openPostgres(url string, o IO, ended func(store.Ending)) (*postgres.Store, error) {
	ctx, cancel := context.WithTimeout(context.Background(), openWithin)
	defer cancel()
	// A database that takes the connection and answers nothing (it
	// hangs) held `timebox run` silent for as long as it hung.
	var (
		mu     sync.Mutex
		opened bool
	)
	note := time.AfterFunc(openNoteAfter, func() {
		mu.Lock()
		defer mu.Unlock()
		if !opened {
			fmt.Fprintf(o.Err, "timebox: waiting for the database at %s: it has not answered for %s (it may be hung, or not PostgreSQL); giving up after %s\n",
				postgres.Redact(url), openNoteAfter, openWithin)
		}
	})
	st, err := postgres.Open(ctx, url, postgres.Options{Logger: slog.New(slog.NewTextHandler(o.Err, nil)), Ended: ended})
	note.Stop()
	mu.Lock()
	opened = true
	mu.Unlock()
	if err != nil && errors.Is(err, context.DeadlineExceeded) {
		// A bare "context deadline exceeded", after a minute, said
		// neither what timed out nor why.
		return nil, fmt.Errorf("opening the store: the database at %s did not answer within %s: its host or port may be wrong, a firewall drops the connection, or the database hangs (connect_timeout=SECONDS in the URL bounds each try)",
			postgres.Redact(url), openWithin)
	}
	if err != nil {
		return nil, err
	}
	return st, nil
}

// openWithin bounds opening a PostgreSQL store: connecting, migrating,
// registering; openNoteAfter is when it says that it waits.
var (
	openWithin    = 60 * time.Second
	openNoteAfter = 2 * time.Second
)
