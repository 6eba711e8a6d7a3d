// Package server is `timebox serve`: the HTTP/SSE API of spec §12 over an
// agent and a store, with the web page at "/", Prometheus metrics, bearer
// token auth, and a shutdown that gives running turns a grace period and
// stores every record before it returns.
//
// Each turn runs on its own goroutine, detached from the request that
// started it: a client that drops a non-detached stream cancels the turn
// with client_gone; a detached turn runs on. Events are queued for the
// store as they are emitted and fanned out to every follower once stored,
// so a follower that reconnects with Last-Event-ID gets exactly what it
// missed.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/ids"
	"github.com/timebox-run/timebox/internal/longjson"
	"github.com/timebox-run/timebox/internal/silentconns"
	"github.com/timebox-run/timebox/store"
)

// Runner runs one turn; *agent.Agent and *timebox.Agent are Runners. Run
// must return once ctx is cancelled (promptly: the server waits for it
// before it stores the record), with the turn's record and the messages it
// added to the conversation.
type Runner interface {
	Run(ctx context.Context, in agent.Input, sinks ...event.Sink) *agent.Result
}

// EngineRunner is a Runner whose turns run on an engine's workers, which
// store their events and records themselves (package temporal's Runner):
// Engine names the engine. The server stores such a turn's start with its
// engine (store.TurnStart.Engine) and publishes its events, and stores
// nothing more of it.
type EngineRunner interface {
	Runner
	Engine() string
}

// EngineCanceller is an EngineRunner that reaches, through its engine, a
// turn it does not follow — one a gateway that is gone started, which no
// worker may be running (package temporal's Runner). The server's cancel
// of a turn it does not run tells the turn's workflow (CancelTurn) besides
// storing the request, and, when the turn still runs after the cancel's
// wait, ends it if no worker will (EndUnworked reports whether it did).
type EngineCanceller interface {
	EngineRunner
	CancelTurn(ctx context.Context, turnID string, ce *budget.CancelError)
	EndUnworked(ctx context.Context, turnID string, waited time.Duration) (bool, error)
}

// engineOf returns the engine of r's turns, "" for turns r runs in this
// process.
func engineOf(r Runner) string {
	if e, ok := r.(EngineRunner); ok {
		return e.Engine()
	}
	return ""
}

// Defaults of Config's zero fields.
const (
	DefaultMaxBodyBytes  = 1 << 20
	DefaultMaxInputBytes = agent.MaxInputBytes
	DefaultKeepAlive     = 15 * time.Second
)

// Config describes a server. Agent and Store are required; every other
// zero field takes the default its comment names.
type Config struct {
	// Agent runs the turns.
	Agent Runner
	// AgentName names the agent in stored turns.
	AgentName string
	// Store keeps the turns. The server does not close it.
	Store store.Store
	// Token, when set, is required as "Authorization: Bearer <token>" on
	// every /v1 route and on /metrics. Without it the server answers only
	// requests addressed to a loopback host, and Serve refuses a
	// non-loopback listener (CheckAddr). New refuses a token that
	// CheckToken refuses.
	Token string
	// ShutdownGrace is how long Shutdown lets running turns go on before it
	// cancels them with stop reason shutdown. Zero cancels them at once;
	// `timebox serve` passes server.shutdown_grace (default 10s).
	ShutdownGrace time.Duration
	// MaxBodyBytes caps a request body; zero is DefaultMaxBodyBytes (1 MiB).
	MaxBodyBytes int64
	// MaxInputBytes caps a turn's input text; zero is DefaultMaxInputBytes
	// (256 KiB).
	MaxInputBytes int
	// KeepAlive is the interval of the SSE keep-alive comments that keep
	// proxies from closing an idle stream and reveal a dead client; zero is
	// DefaultKeepAlive (15s).
	KeepAlive time.Duration
	// Registry receives the server's metrics and is what /metrics serves;
	// nil is a new registry with the Go and process collectors.
	Registry *prometheus.Registry
	// Logger receives one line per turn and every store error; nil
	// discards them.
	Logger *slog.Logger
	// Budgets are the agent's budgets GET /v1/stats compares the stored
	// calls with. Nil is Agent's own when it tells them (AgentBudgets:
	// *agent.Agent, *timebox.Agent); a Runner that does not (an engine's,
	// such as package temporal's) needs it, or each tool's budget in the
	// report is its latest call's.
	Budgets AgentBudgets
	// Webhooks are the receivers the server POSTs events to
	// (server.webhooks, docs/webhooks.md); Store must then keep deliveries
	// (store.Deliveries). New refuses a URL that is not http(s) and a
	// webhook without a secret; Serve one that points at the server.
	Webhooks []Webhook
	// WebhookOptions tune their delivery; the zero value is the default.
	WebhookOptions WebhookOptions
	// AdoptInterval is how often Serve looks for the turns of Agent's
	// engine, begun for AgentName, whose follower is gone (a detached
	// turn whose gateway died), to adopt them: it follows each as a turn
	// of its own (Adopter, store.Followers). Zero is DefaultAdoptInterval
	// (5s); negative never looks. Only an Adopter with a store.Followers
	// store adopts.
	AdoptInterval time.Duration
}

// Server is the HTTP API over one agent and one store. It is an
// http.Handler; Serve runs it on a listener with the whole shutdown
// sequence. Its methods are safe for concurrent use.
type Server struct {
	cfg     Config
	mux     *http.ServeMux
	paths   *http.ServeMux      // the API's paths, any method (routes)
	allow   map[string][]string // each API path's methods
	m       *metrics
	reg     *prometheus.Registry
	log     *slog.Logger
	token   [32]byte // sha256 of cfg.Token
	metrics http.Handler
	hooks   *webhooks // nil without webhooks

	mu       sync.Mutex
	turns    map[string]*liveTurn
	sessions map[string]string // session id → its running turn's id
	draining bool
	running  sync.WaitGroup

	closing      chan struct{} // closed when Shutdown ends every stream
	streams      streams       // the streams that took their connections (park.go)
	writers      writers       // the goroutines that drive woken streams (writers.go)
	hurry        chan struct{} // closed by EndGrace
	hurryOnce    sync.Once
	shutdownOnce sync.Once
	shutdownErr  error
	stopAdopting chan struct{}  // closed by Shutdown
	adopted      sync.WaitGroup // the look for turns to adopt (adopt.go)
}

// liveTurn is a turn running in this server.
type liveTurn struct {
	id, session string
	cancel      context.CancelCauseFunc
	hub         *hub
	// ended is closed once the turn has ended, res set before; done once
	// its record is stored too (or the store gave up on it).
	ended, done chan struct{}
	res         *agent.Result
	// suspend, closed when the server shuts down, suspends the turn if it
	// waits for nothing but people (agent.Input.Suspend).
	suspend     chan struct{}
	suspendOnce sync.Once
}

// record returns the ended turn's record; for a turn that was suspended,
// the stored one (running).
func (lt *liveTurn) record(s *Server) *event.Turn {
	if lt.res.Record != nil {
		return lt.res.Record
	}
	if rec, err := s.cfg.Store.Turn(context.Background(), lt.id); err == nil {
		return rec
	}
	return &event.Turn{TurnID: lt.id, SessionID: lt.session, Status: budget.StatusRunning}
}

// storedOrLater waits, briefly, for an ended turn's record to be stored,
// so that its session is free for the client's next message when the
// answer reaches it; a store that is away does not hold the answer back.
func (lt *liveTurn) storedOrLater() {
	t := time.NewTimer(storedWait)
	defer t.Stop()
	select {
	case <-lt.done:
	case <-t.C:
	}
}

// storedWait bounds how long an answer waits for its record to be stored.
const storedWait = 5 * time.Second

// New returns a server. It returns an error if Agent or Store is missing or
// the metrics cannot be registered in Registry. With Webhooks, New starts
// their sender: Shutdown stops it, whether or not the server was served.
func New(cfg Config) (*Server, error) {
	if cfg.Agent == nil || cfg.Store == nil {
		return nil, errors.New("server: Config.Agent and Config.Store are required")
	}
	if cfg.Token != "" {
		if _, err := CheckToken(cfg.Token); err != nil {
			return nil, fmt.Errorf("server: token: %w", err)
		}
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxInputBytes <= 0 {
		cfg.MaxInputBytes = DefaultMaxInputBytes
	}
	if cfg.KeepAlive <= 0 {
		cfg.KeepAlive = DefaultKeepAlive
	}
	if cfg.ShutdownGrace < 0 {
		cfg.ShutdownGrace = 0
	}
	s := &Server{cfg: cfg, reg: cfg.Registry, log: cfg.Logger, turns: map[string]*liveTurn{}, sessions: map[string]string{},
		closing: make(chan struct{}), hurry: make(chan struct{}), stopAdopting: make(chan struct{})}
	if s.reg == nil {
		s.reg = defaultRegistry()
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	var err error
	if s.m, err = newMetrics(s.reg, func() float64 { return float64(s.Running()) }); err != nil {
		return nil, fmt.Errorf("server: registering metrics: %w", err)
	}
	if len(cfg.Webhooks) > 0 {
		if s.hooks, err = newWebhooks(cfg.Webhooks, cfg.Store, cfg.WebhookOptions, s.m, s.log); err != nil {
			return nil, err
		}
	}
	s.token = hashToken(cfg.Token)
	s.metrics = promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{})
	s.routes()
	return s, nil
}

// Running returns the number of turns running in this server.
func (s *Server) Running() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.turns)
}

// Registry returns the registry /metrics serves.
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// ServeHTTP implements http.Handler. Every response names its request
// (HeaderRequestID): an error's cause is logged under that id.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := ids.New("req_")
	w.Header().Set(HeaderRequestID, id)
	s.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), requestIDKey{}, id)))
}

type requestIDKey struct{}

// requestID returns the id ServeHTTP gave r.
func requestID(r *http.Request) string {
	id, _ := r.Context().Value(requestIDKey{}).(string)
	return id
}

// storeLate stores the record of an abandoned tool call that returned
// after its turn ended; the turn's sink passes it on (event.LateSink).
func (s *Server) storeLate(rec event.ToolCall) {
	if err := s.cfg.Store.UpdateToolCall(context.Background(), rec); err != nil {
		s.storeError("update_tool_call", rec.TurnID, err)
	}
}

func (s *Server) storeError(op, turnID string, err error) {
	s.m.storeErrors.WithLabelValues(op).Inc()
	s.log.Error("store write failed", "op", op, "turn_id", turnID, "err", err)
}

// newSessionID returns a fresh session id.
func newSessionID() string { return ids.New("s_") }

// errBusy, errDraining and errStoreAway are why a turn could not start.
var (
	errDraining  = errors.New("draining")
	errBusy      = errors.New("session busy")
	errStoreAway = errors.New("the store cannot be reached for now")
)

// start registers, stores and starts a turn. The returned subscription is
// taken before the turn emits anything, so the caller sees every event.
func (s *Server) start(ctx context.Context, session, input string, budgets budget.Request, detach bool) (*liveTurn, *sub, error) {
	id := agent.NewTurnID()
	// The turn outlives the request, but is traced under the request's
	// parent, if it has one.
	turnCtx, cancel := context.WithCancelCause(agent.WithTraceParent(context.Background(), agent.TraceParent(ctx)))
	lt := &liveTurn{id: id, session: session, cancel: cancel, hub: newHub(), ended: make(chan struct{}), done: make(chan struct{}),
		suspend: make(chan struct{})}
	s.mu.Lock()
	if s.draining {
		s.mu.Unlock()
		cancel(nil)
		return nil, nil, errDraining
	}
	if busy, ok := s.sessions[session]; ok {
		s.mu.Unlock()
		cancel(nil)
		return nil, nil, fmt.Errorf("%w: session %s has a turn running (%s); wait for it to end or cancel it", errBusy, session, busy)
	}
	s.turns[id], s.sessions[session] = lt, id
	s.running.Add(1)
	s.mu.Unlock()

	fail := func(err error) (*liveTurn, *sub, error) {
		s.forget(lt)
		s.running.Done()
		cancel(nil)
		return nil, nil, err
	}
	// Watching for cancel requests before the turn is stored, so that a
	// request made through another gateway sharing the store the moment
	// it can see the turn is not missed.
	cancelled, unwatch := s.cfg.Store.WatchCancel(id)
	begun := time.Now()
	ts := store.TurnStart{TurnID: id, SessionID: session, Agent: s.cfg.AgentName, Input: input, StartedAt: begun, Engine: engineOf(s.cfg.Agent)}
	if o, ok := s.cfg.Store.(store.Owned); ok && ts.Engine != "" {
		// This gateway follows the turn: gone, a live one adopts it.
		ts.Follower = o.Owner()
		if !detach {
			// A turn an engine runs would outlive this gateway: gone, it
			// is cancelled as its client would be (client_gone).
			ts.Caller = o.Owner()
		}
	}
	if err := s.cfg.Store.BeginTurn(ctx, ts); err != nil {
		unwatch()
		if errors.Is(err, store.ErrSessionBusy) {
			// Running through another gateway sharing the store.
			return fail(fmt.Errorf("%w: %v; wait for it to end or cancel it", errBusy, err))
		}
		if ctx.Err() == nil {
			// A write the store failed (timebox_store_errors_total), not
			// a client that gave up waiting for it.
			s.m.storeErrors.WithLabelValues("begin_turn").Inc()
		}
		if errors.Is(err, store.ErrUnavailable) {
			return fail(fmt.Errorf("%w: %v", errStoreAway, err))
		}
		return fail(fmt.Errorf("storing the turn: %w", err))
	}
	// The history is read once the turn holds the session: a turn of the
	// session that another gateway was ending meanwhile has stored its
	// messages by then (read before, they could be missing).
	// A database that hangs is given up within the store's bound on its
	// silence, as beginning the turn is (store.ErrUnavailable).
	history, err := s.cfg.Store.History(ctx, session)
	if err != nil {
		unwatch()
		err = fmt.Errorf("reading the history of session %s: %w", session, err)
		s.storeError("history", id, err)
		now := time.Now()
		// The record is read by clients: the store's error (its database,
		// host, user) stays in the log.
		rec := &event.Turn{TurnID: id, SessionID: session, Agent: s.cfg.AgentName, Input: input, StartedAt: begun, EndedAt: now,
			WallMS: now.Sub(begun).Milliseconds(), Status: budget.StatusInterrupted, StopReason: budget.Interrupted,
			Message: fmt.Sprintf("Interrupted before it began: the history of session %s could not be read from the store (the server's log has the cause, under turn %s). Nothing was run. Send the message again.", session, id)}
		// The end goes on while the database is away or hangs (the
		// turn's end always reaches the store), the client is not held
		// for it: it is stored in the background, and Shutdown waits for
		// it as for a running turn.
		s.running.Add(1)
		go func() {
			defer s.running.Done()
			if ferr := s.cfg.Store.FinishTurn(context.Background(), rec, nil); ferr != nil {
				s.storeError("finish_turn", id, ferr)
			}
		}()
		if errors.Is(err, store.ErrUnavailable) {
			return fail(fmt.Errorf("%w: %v", errStoreAway, err))
		}
		return fail(err)
	}
	sb, _, _ := lt.hub.subscribe()
	s.log.Info("turn started", "turn_id", id, "session_id", session)
	go s.cancelled(lt, cancelled, unwatch)
	in := agent.Input{TurnID: id, SessionID: session, History: history, Text: input, Budgets: budgets, Approver: s.approver()}
	if s.suspender() != nil {
		in.Suspend = lt.suspend
	}
	go s.run(turnCtx, lt, func(sinks ...event.Sink) *agent.Result { return s.cfg.Agent.Run(turnCtx, in, sinks...) })
	return lt, sb, nil
}

// cancelled cancels lt when the store signals a cancel request made
// through another gateway sharing it (or that another gateway ended the
// turn, taking this one for gone), until the turn ends.
func (s *Server) cancelled(lt *liveTurn, signal <-chan struct{}, unwatch func()) {
	defer unwatch()
	select {
	case <-signal:
		cause := store.WhyCancelled(s.cfg.Store, lt.id, "a client of another gateway")
		s.log.Info("turn cancelled through the store", "turn_id", lt.id, "reason", cause.Reason, "by", cause.By)
		lt.cancel(cause)
	case <-lt.done:
	}
}

func (s *Server) forget(lt *liveTurn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.turns, lt.id)
	if s.sessions[lt.session] == lt.id {
		delete(s.sessions, lt.session)
	}
}

// run runs the turn (Run, or Resume) and stores its record, or, for a
// turn suspended as the server stops, its checkpoint.
func (s *Server) run(_ context.Context, lt *liveTurn, turn func(...event.Sink) *agent.Result) {
	defer s.running.Done()
	defer lt.cancel(nil)
	engine := engineOf(s.cfg.Agent)
	res := turn(&turnSink{s: s, lt: lt, stored: engine != ""})
	lt.res = res
	if res.Suspended != nil {
		s.suspended(lt, res.Suspended)
		return
	}
	// Its followers have had its turn_finished; a client waiting for its
	// record gets it now, whether or not the store has it yet.
	close(lt.ended)
	// FinishTurn stores the events still queued first. It goes on while
	// the database is away (store.Store: the turn's end always reaches
	// the store), and the session stays this turn's until it has. An
	// engine's workers stored the turn themselves.
	if engine == "" {
		if err := s.cfg.Store.FinishTurn(context.Background(), res.Record, res.Messages); err != nil {
			s.storeError("finish_turn", lt.id, err)
		} else if n := lt.hub.refusals(); n > 0 && store.EndStoresLog(res.Record) {
			// The errors logged for them as the turn ran lost nothing.
			s.log.Info("the turn's end stored the events the store refused as it ran", "turn_id", lt.id, "events", n)
		}
	}
	// The record is stored: from here a follower that finds the hub ended
	// reads the whole turn from the store. The session is free again
	// before anyone waiting on done hears of the end, so a client can send
	// its next message as soon as its stream ends.
	lt.hub.end()
	s.forget(lt)
	close(lt.done)
	r := res.Record
	s.log.Info("turn ended", "turn_id", lt.id, "status", r.Status, "stop_reason", r.StopReason, "wall_ms", r.WallMS)
}

// turnSink publishes each event of a turn to its followers as it is
// emitted — the live stream never waits for the store — and queues it for
// the store, telling the hub once it is committed (hub.storedUpTo), in
// queue order. The hub keeps what the store does not have yet, so that a
// follower that replays from the store has no gap. The turn waits, at most
// store.RecordWait, only for the events that carry a call record
// (store.Enqueue).
type turnSink struct {
	s  *Server
	lt *liveTurn
	// stored: the events come from the store already (EngineRunner), and
	// are only published.
	stored bool
}

// LateResult implements event.LateSink.
func (t *turnSink) LateResult(rec event.ToolCall) { t.s.storeLate(rec) }

// ShareReply implements event.ReplySharer: a memory store lets a long
// reply's chunks go once it is joined.
func (t *turnSink) ShareReply(deltas []event.Event) {
	if !t.stored {
		store.ShareReply(t.s.cfg.Store, deltas)
	}
}

// Emit implements event.Sink.
func (t *turnSink) Emit(e event.Event) {
	data, merr := frameData(e)
	if merr != nil {
		t.s.log.Error("encoding an event", "turn_id", e.TurnID, "seq", e.Seq, "err", merr)
	} else {
		t.lt.hub.publish(frame{seq: e.Seq, typ: e.Type, at: e.At, data: data})
		t.s.m.observe(e)
	}
	if merr == nil && t.s.hooks != nil {
		body, whole := data.Raw()
		if !whole {
			body = data.Bytes()
		}
		t.s.hooks.offer(e, body)
	}
	if t.stored {
		t.lt.hub.storedUpTo(e.Seq)
		return
	}
	store.Enqueue(t.s.cfg.Store, e, func(err error) {
		if err != nil {
			// Not stored: it says nothing of the events before it either.
			t.s.storeError("append_event", e.TurnID, fmt.Errorf("event %d (%s): %w", e.Seq, e.Type, err))
			t.lt.hub.refused(e.Seq)
			return
		}
		t.lt.hub.storedUpTo(e.Seq)
	})
}

// frameData is e's JSON as its frame carries it: an event read back as
// it was stored, as it is; any other as event.MarshalDoc makes it, a long
// answer not escaped until a follower's writer takes it (issue 29).
func frameData(e event.Event) (longjson.Doc, error) {
	if _, raw := e.Data.(json.RawMessage); raw {
		b, err := e.MarshalJSON()
		return longjson.Whole(b), err
	}
	return event.MarshalDoc(e)
}

func (s *Server) live(id string) *liveTurn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.turns[id]
}

// cancelTurn cancels a live turn for cause.
func (s *Server) cancelTurn(lt *liveTurn, cause error) { lt.cancel(cause) }

// EndGrace cuts a Shutdown's grace period short: running turns are
// cancelled (shutdown) at once. `timebox serve` calls it on a second
// SIGINT or SIGTERM.
func (s *Server) EndGrace() { s.hurryOnce.Do(func() { close(s.hurry) }) }

// turnsEndWithin is how long Shutdown waits for cancelled turns to store
// their records. A turn stops its tools within about a second of its
// cancellation (budget.CancelGrace plus reaping); this only guards against
// a Runner that ignores its context.
const turnsEndWithin = 30 * time.Second

// Shutdown stops the server from starting turns, lets the running ones go
// on for Config.ShutdownGrace (or until ctx is done, or EndGrace), cancels
// those still running with stop reason shutdown, waits until their records
// are stored, and then ends every open event stream. It does not close the
// store or any listener (Serve does the latter). It returns an error only
// if a turn did not end within 30s of its cancellation. Shutdown is
// idempotent: later calls wait for the first and return its result.
func (s *Server) Shutdown(ctx context.Context) error {
	s.shutdownOnce.Do(func() {
		// No turn is adopted from here: those adopted are this gateway's
		// running turns, left below as the others are.
		close(s.stopAdopting)
		s.adopted.Wait()
		s.mu.Lock()
		s.draining = true
		n := len(s.turns)
		for _, lt := range s.turns {
			// A turn waiting for nothing but people is suspended at once,
			// to be resumed by the next server (docs/approvals.md).
			lt.suspendOnce.Do(func() { close(lt.suspend) })
		}
		s.mu.Unlock()
		all := make(chan struct{})
		go func() {
			s.running.Wait()
			close(all)
		}()
		if n > 0 {
			s.log.Info("shutting down: waiting for running turns", "turns", n, "grace", s.cfg.ShutdownGrace)
		}
		grace := time.NewTimer(s.cfg.ShutdownGrace)
		select {
		case <-all:
		case <-grace.C:
		case <-ctx.Done():
		case <-s.hurry:
		}
		grace.Stop()
		s.mu.Lock()
		left := make([]*liveTurn, 0, len(s.turns))
		for _, lt := range s.turns {
			left = append(left, lt)
		}
		s.mu.Unlock()
		var stop error = &budget.CancelError{Reason: budget.Shutdown, By: "the server"}
		if engineOf(s.cfg.Agent) != "" {
			// An engine's turns run on without this gateway: it stops
			// following them (docs/temporal.md).
			stop = agent.ErrStopFollowing
		}
		for _, lt := range left {
			s.cancelTurn(lt, stop)
		}
		if len(left) > 0 {
			s.log.Info("shutting down: cancelled running turns", "turns", len(left))
		}
		t := time.NewTimer(turnsEndWithin)
		select {
		case <-all:
		case <-t.C:
			s.shutdownErr = fmt.Errorf("server: %d turn(s) did not end within %s of their cancellation; their records may be incomplete", s.Running(), turnsEndWithin)
		}
		t.Stop()
		if s.hooks != nil {
			// Every turn has ended: no event is offered any more.
			s.hooks.shutdown()
		}
		close(s.closing)
		s.streams.wakeAll(false)
	})
	<-s.closing
	return s.shutdownErr
}

// Serve answers HTTP requests on ln until ctx is done, then shuts down:
// the listener is closed at once (no new connections), running turns get
// Config.ShutdownGrace, the rest are cancelled (shutdown) and stored, and
// Serve returns once every request has ended. It refuses (returning an
// error, with ln closed) a listener that is not on a loopback address when
// Config.Token is empty. It returns nil after a shutdown, or the error that
// stopped the listener.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if err := CheckAddr(ln.Addr().String(), s.cfg.Token); err != nil {
		ln.Close()
		return err
	}
	if err := CheckWebhooks(s.cfg.Webhooks, ln.Addr().String()); err != nil {
		ln.Close()
		if s.hooks != nil {
			s.hooks.shutdown()
		}
		return err
	}
	hs := &http.Server{
		Handler: s,
		// No WriteTimeout: event streams last as long as their turns; each
		// stream write has its own deadline instead (sse.write).
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	// A browser's preconnected socket, which never sends a request, would
	// hold the stop for 5s.
	silent := silentconns.New()
	hs.ConnState = silent.State
	served := make(chan error, 1)
	// The turns the last server suspended while they waited for people
	// go on here.
	s.resumeSuspended(ctx)
	// The engine turns whose follower is gone are followed here.
	s.adopting()
	go func() { served <- hs.Serve(ln) }()
	var serveErr error
	select {
	case serveErr = <-served:
	case <-ctx.Done():
	}
	closed := make(chan error, 1)
	silent.Stop()
	go func() { closed <- hs.Shutdown(context.Background()) }()
	err := s.Shutdown(context.Background())
	// Every stream has ended; requests still being answered are short.
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		hs.Close()
		<-closed
	}
	// http.Server does not wait for the streams that took their
	// connections: they send what is stored, then end.
	s.streams.wait(5 * time.Second)
	if serveErr == nil {
		serveErr = <-served
	}
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	return errors.Join(serveErr, err)
}

// CheckAddr returns an error, ready to show to a person, if addr is not
// host:port with a valid port, or is not a loopback address and token is
// empty: a server anyone can reach must not run the agent's tools for
// anyone. "localhost" counts as loopback; an empty host (all interfaces)
// does not.
func CheckAddr(addr, token string) error {
	host, port, err := net.SplitHostPort(addr)
	if err == nil {
		_, err = net.LookupPort("tcp", port)
	}
	if ae, ok := err.(*net.AddrError); ok {
		err = errors.New(ae.Err) // not "address X: " again
	}
	if err != nil {
		return fmt.Errorf("address %q: %v (use host:port, such as 127.0.0.1:8080)", addr, err)
	}
	if token != "" || isLoopback(host) {
		return nil
	}
	shown := addr
	if host == "" {
		shown += " (every interface)"
	}
	return fmt.Errorf("refusing to serve on %s without a token: anyone who can reach that address could run this agent's tools. Set --token or TIMEBOX_TOKEN, or bind a loopback address such as 127.0.0.1:8080", shown)
}

// MinTokenLength is the length below which CheckToken warns that a token
// could be guessed.
const MinTokenLength = 16

// CheckToken checks a bearer token that was given (an empty one was given
// as empty, which is not the same as none). It returns an error, a
// sentence fragment with its fix, for a token no client could send: empty,
// only whitespace, or holding whitespace or control characters (an
// Authorization header carries one word); and a warning for one shorter
// than MinTokenLength.
func CheckToken(token string) (warning string, err error) {
	const fix = "use 16 or more letters and digits, such as the output of `openssl rand -hex 32`"
	switch {
	case token == "":
		return "", fmt.Errorf("is empty: it would serve without a token (%s; or leave it unset for no token)", fix)
	case strings.TrimSpace(token) == "":
		return "", fmt.Errorf("is only whitespace (%s)", fix)
	case strings.ContainsFunc(token, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return "", fmt.Errorf("holds whitespace or a control character, which an Authorization header cannot carry as one token (%s)", fix)
	case utf8.RuneCountInString(token) < MinTokenLength:
		return fmt.Sprintf("is shorter than %d characters; a short token can be guessed (%s)", MinTokenLength, fix), nil
	}
	return "", nil
}

// isLoopback reports whether host (a name or an IP, without port) is a
// loopback host.
func isLoopback(host string) bool {
	if strings.EqualFold(host, "localhost") { // host names have no case
		return true
	}
	if i := strings.IndexByte(host, '%'); i >= 0 { // an IPv6 zone
		host = host[:i]
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
