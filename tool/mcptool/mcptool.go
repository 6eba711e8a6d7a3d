// Package mcptool makes the tools of a Model Context Protocol server timebox
// tools (spec §3, §4, §9): a stdio server started from a command, whose
// process tree timebox owns and stops, or a streamable HTTP server at a URL.
//
// Every tool the server lists becomes a tool named "<entry>__<tool>". Each
// call carries a progress token; every progress notification is reported to
// the call's tool.Progress, in the order it arrived on the wire, so that a
// final progress event racing the response is never lost. When the call's
// context is done — its own timeout, its idle window, or the turn being
// cancelled — the call returns at once with context.Cause, a
// notifications/cancelled goes out for it at that moment, and whatever the
// server sends for it afterwards (progress, the reply) is dropped quietly
// and counted in Stats.
//
// A server that crashes, or stops answering pings, fails its in-flight calls
// with a tool error that says so, and is restarted for the next call, with
// backoff when it keeps failing. Close stops everything a Server started.
//
// The package uses the official Go SDK (github.com/modelcontextprotocol/go-sdk)
// and keeps it out of every other package.
package mcptool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/problem"
	"github.com/timebox-run/timebox/tool"
	"github.com/timebox-run/timebox/tool/runas"
)

// DefaultStartTimeout bounds the start of a server: spawning it (or
// reaching its URL), the initialize handshake and, the first time, listing
// its tools. A server that has not answered by then is stopped and Open
// returns an error. It is generous because `npx -y` may first download the
// package; a pre-installed server starts in well under a second.
const DefaultStartTimeout = 30 * time.Second

// DefaultKeepAlive is the interval between the pings that tell a hung server
// while it has no call to run. A server that leaves two pings in a row
// unanswered for half an interval each, with no call in flight, is
// declared hung and is stopped; it is started again for the next call.
// While a call is in flight, an unanswered ping is not held against the
// server: a server whose tool blocks its event loop answers no ping and is
// busy, not hung, and the call's own budgets (its timeout, its
// idle_timeout) say how long it may be. A ping the transport fails (the
// server's address refuses connections) counts whatever runs.
const DefaultKeepAlive = 10 * time.Second

// Config describes one mcp entry of an agent file. Exactly one of Command
// and URL is set. Open copies it; later changes have no effect.
type Config struct {
	// Name is the entry's name, the prefix of its tools' names.
	Name string

	// Command is a stdio server's argv. Its program is looked up in PATH
	// unless it contains a slash. The server runs in its own process group,
	// stopped with it.
	Command []string
	// Env is the allowlist of variables a stdio server inherits; nil means
	// the whole environment but Withhold, empty means none.
	Env []string
	// Withhold names the variables a stdio server does not inherit when
	// Env is nil: timebox's own secrets (config.Agent.Withheld).
	Withhold []string
	// User, when set, is who a stdio server runs as (tools[].user).
	User *runas.Identity
	// Dir is a stdio server's working directory; empty means the current
	// one. timebox passes the agent file's directory.
	Dir string

	// URL is a streamable HTTP server's endpoint; Headers are sent with
	// every request to it.
	URL     string
	Headers map[string]string

	// Budget is the entry's resolved budget. Each tool's budget is Budget
	// with that tool's override, if any, applied field by field. Its
	// KillGrace is also the time a stopping server gets between each step
	// of its shutdown (stdin closed, SIGTERM, SIGKILL).
	Budget budget.ToolBudget
	// Overrides are per-tool budget overrides, by the server's own tool
	// name. An override that names no tool of the server is an error: a
	// typo must not silently leave a tool on the entry's budget.
	Overrides map[string]Override

	// RestartOnIgnoredCancel, for a stdio server (Command), restarts the
	// server when a call of it was cancelled (its budget, the turn's end,
	// a client's cancel) and the server has not answered the call the
	// call's kill grace after the cancellation (GraceFor): its whole
	// process tree is killed, the other calls in flight on it fail with a
	// tool error saying why, and a fresh server is started at once for
	// the next call (mcp.on_ignored_cancel: restart). The stopped call waits for that
	// before it returns, and what it returns says so
	// (tool.Result.ServerRestarted); under hard enforcement tool.Run waits
	// for it (the grace plus tool.ReapMargin), under cooperative it may
	// abandon the call first, and the server is restarted all the same.
	// False leaves the server running, the call's work perhaps going on
	// in it. It is ignored for a URL server.
	RestartOnIgnoredCancel bool

	// StartTimeout bounds each start of the server; zero means
	// DefaultStartTimeout.
	StartTimeout time.Duration
	// KeepAlive is the ping interval; zero means DefaultKeepAlive, a
	// negative value turns pings off (a hung server is then noticed only
	// through its calls' timeouts).
	KeepAlive time.Duration
	// Stderr receives a stdio server's own log. Nil discards it; the last
	// few KiB are kept either way for the messages of a crash.
	Stderr io.Writer
	// Logger receives restarts, hangs and dropped late messages at Info
	// and Debug level; nil discards them.
	Logger *slog.Logger

	// dial replaces Command and URL in tests: it returns a fresh transport
	// for each start.
	dial func(ctx context.Context) (mcp.Transport, error)
	// onCancel, in tests, sees each call's cancellation before it is
	// written; the write waits for it to return.
	onCancel func(token string, at time.Time)
	// onRead, in tests, sees each message read once timebox has noted it,
	// before the SDK does.
	onRead func(jsonrpc.Message)
}

// Override is one tool's budget override inside an mcp entry. A zero field
// (empty Source, empty Enforcement) leaves the entry's value.
type Override struct {
	// Timeout is the tool's timeout, and IdleTimeout the longest silence
	// allowed between its progress reports.
	Timeout     budget.Duration
	IdleTimeout budget.Duration
	// Enforcement is how the timeout is enforced.
	Enforcement budget.Enforcement
}

// Stats are counters of one Server, for tests, benchmarks and metrics.
type Stats struct {
	// Starts counts successful starts, the first one included; every start
	// after the first is a restart.
	Starts int64
	// CancelsSent counts notifications/cancelled sent for calls whose
	// context ended before the server replied.
	CancelsSent int64
	// LateProgress counts progress notifications that arrived for a call
	// that had already ended; LateReplies, replies to calls that had been
	// stopped, whether their cancellation had gone out yet or not. Both are
	// dropped quietly.
	LateProgress int64
	LateReplies  int64
	// IgnoredCancelRestarts counts the restarts RestartOnIgnoredCancel
	// made: servers killed for not answering a cancelled call in time.
	IgnoredCancelRestarts int64
}

// Server is a running MCP server entry and its tools. Its methods are safe
// for concurrent use.
type Server struct {
	cfg          Config
	startTimeout time.Duration
	keepAlive    time.Duration
	log          *slog.Logger
	client       *mcp.Client
	tools        []*Tool

	mu       sync.Mutex
	cur      *link         // the live connection; nil while the server is down
	starting chan struct{} // closed when the restart under way ends; nil if none
	lastErr  error         // why the last connection ended or the last start failed
	failures int           // consecutive failures since the last good call
	retryAt  time.Time     // no restart before this (backoff)
	closed   bool
	closing  chan struct{} // closed by Close
	closeMu  sync.Mutex    // serialises Close

	calls    sync.Map // progress token (string) → *active
	seq      atomic.Int64
	inFlight atomic.Int64 // calls begun and not ended
	stats    counters
	linkWG   sync.WaitGroup // each link's watcher and keepalive goroutines
}

type counters struct {
	starts, cancels, lateProgress, lateReplies, ignoredCancels atomic.Int64
}

// Stats returns the server's counters.
func (s *Server) Stats() Stats {
	return Stats{
		Starts:       s.stats.starts.Load(),
		CancelsSent:  s.stats.cancels.Load(),
		LateProgress: s.stats.lateProgress.Load(),
		LateReplies:  s.stats.lateReplies.Load(),

		IgnoredCancelRestarts: s.stats.ignoredCancels.Load(),
	}
}

// Tools returns the server's tools, in the order the server listed them.
func (s *Server) Tools() []*Tool { return append([]*Tool(nil), s.tools...) }

// Name returns the entry's name.
func (s *Server) Name() string { return s.cfg.Name }

// Open starts the server, lists its tools and returns them with their
// budgets resolved. The start is bounded by ctx and by the start timeout.
// It returns an error when the configuration is incomplete, when the server
// cannot be started or does not answer in time, or when an override names
// a tool the server does not have; nothing is left running then.
func Open(ctx context.Context, cfg Config) (*Server, error) {
	cfg.Command = append([]string(nil), cfg.Command...)
	if cfg.Env != nil {
		cfg.Env = append([]string{}, cfg.Env...)
	}
	cfg.Headers = maps.Clone(cfg.Headers)
	cfg.Overrides = maps.Clone(cfg.Overrides)
	switch {
	case cfg.Name == "":
		return nil, errors.New("mcptool: the entry has no name")
	case cfg.dial == nil && len(cfg.Command) == 0 && cfg.URL == "":
		return nil, fmt.Errorf("mcptool: entry %q needs a command or a url", cfg.Name)
	case len(cfg.Command) > 0 && cfg.URL != "":
		return nil, fmt.Errorf("mcptool: entry %q has both a command and a url", cfg.Name)
	}
	s := &Server{cfg: cfg, startTimeout: cfg.StartTimeout, keepAlive: cfg.KeepAlive, log: cfg.Logger,
		closing: make(chan struct{})}
	if s.startTimeout <= 0 {
		s.startTimeout = DefaultStartTimeout
	}
	if s.keepAlive == 0 {
		s.keepAlive = DefaultKeepAlive
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.client = mcp.NewClient(&mcp.Implementation{Name: "timebox", Version: "0.1.0"}, &mcp.ClientOptions{
		Logger: s.log,
		// Capabilities left nil advertise roots, which timebox does not
		// serve; an empty set advertises nothing it cannot do.
		Capabilities: &mcp.ClientCapabilities{},
	})

	sctx, cancel := context.WithTimeoutCause(ctx, s.startTimeout, errStartTimeout)
	defer cancel()
	l, err := s.dial(sctx)
	if err != nil {
		return nil, err
	}
	var listed []*mcp.Tool
	for t, err := range l.sess.Tools(sctx, nil) {
		if err != nil {
			err = s.startError(sctx, l, fmt.Errorf("listing its tools: %w", err))
			l.stop(s.grace())
			s.linkWG.Wait()
			return nil, err
		}
		listed = append(listed, t)
	}
	tools, err := s.makeTools(listed)
	if err != nil {
		l.stop(s.grace())
		s.linkWG.Wait()
		return nil, err
	}
	s.tools = tools
	s.mu.Lock()
	s.cur = l
	s.mu.Unlock()
	return s, nil
}

var errStartTimeout = errors.New("start timeout")

// makeTools turns the server's tools into timebox tools with resolved
// budgets and checks the overrides against them.
func (s *Server) makeTools(listed []*mcp.Tool) ([]*Tool, error) {
	remote := make([]string, len(listed))
	for i, t := range listed {
		remote[i] = t.Name
	}
	var problems []string
	for name := range s.cfg.Overrides {
		if !slices.Contains(remote, name) {
			problems = append(problems, fmt.Sprintf("overrides[%s] names no tool of the server%s", name, problem.DidYouMean(name, remote)))
		}
	}
	if len(problems) > 0 {
		slices.Sort(problems)
		return nil, fmt.Errorf("%s (its tools: %s)", strings.Join(problems, "; "), strings.Join(remote, ", "))
	}
	names := toolNames(s.cfg.Name, remote)
	out := make([]*Tool, 0, len(listed))
	for i, t := range listed {
		desc := t.Description
		if desc == "" {
			desc = t.Title
		}
		schema, warning := inputSchema(t.InputSchema)
		if warning != "" {
			s.log.Warn("mcp tool schema replaced", "entry", s.cfg.Name, "tool", t.Name, "why", warning)
		}
		b := s.cfg.Budget
		if o, ok := s.cfg.Overrides[t.Name]; ok {
			if o.Timeout.Source != "" {
				b.Timeout = o.Timeout
			}
			if o.IdleTimeout.Source != "" {
				b.IdleTimeout = o.IdleTimeout
			}
			if o.Enforcement != "" {
				b.Enforcement = o.Enforcement
			}
		}
		if b.Enforcement == "" {
			b.Enforcement = tool.DefaultEnforcement(tool.KindMCP)
		}
		out = append(out, &Tool{srv: s, remote: t.Name, budget: b,
			spec: tool.Spec{Name: names[i], Description: desc, InputSchema: schema}})
	}
	return out, nil
}

// Tool is one tool of an MCP server. It implements tool.Tool and is safe
// for concurrent calls.
type Tool struct {
	srv    *Server
	remote string
	spec   tool.Spec
	budget budget.ToolBudget
}

// Spec returns the tool's name ("<entry>__<tool>"), the server's
// description and its input schema.
func (t *Tool) Spec() tool.Spec { return t.spec }

// Kind returns tool.KindMCP.
func (t *Tool) Kind() tool.Kind { return tool.KindMCP }

// Budget returns the tool's resolved budget: the entry's, with the tool's
// override applied.
func (t *Tool) Budget() budget.ToolBudget { return t.budget }

// RemoteName returns the tool's name on the server.
func (t *Tool) RemoteName() string { return t.remote }

// Call calls the tool on the server, with a progress token whose
// notifications go to c.Progress. It returns as soon as ctx is done, with
// context.Cause(ctx), and the cancellation goes out to the server at that
// moment. An MCP error result (isError) is returned as the output together
// with a *tool.Error; a protocol error, a server that cannot be started and
// a server that dies during the call are a *tool.Error saying so.
func (t *Tool) Call(ctx context.Context, c *tool.Call) (*tool.Result, error) {
	s := t.srv
	l, err := s.session(ctx, c.Deadline)
	if err != nil {
		if ctx.Err() != nil {
			return nil, context.Cause(ctx)
		}
		return nil, err
	}
	args := json.RawMessage(c.Input)
	if len(strings.TrimSpace(string(args))) == 0 {
		args = json.RawMessage("{}")
	}
	a := s.begin(ctx, c)
	defer s.end(a)
	params := &mcp.CallToolParams{Name: t.remote, Arguments: args}
	params.SetProgressToken(a.token)
	if c.TraceParent != "" {
		if params.Meta == nil {
			params.Meta = mcp.Meta{}
		}
		params.Meta["traceparent"] = c.TraceParent
	}
	sdkCtx, stop := detach(context.WithValue(ctx, activeKey{}, a))
	defer stop()
	res, err := l.sess.CallTool(sdkCtx, params)
	if err != nil {
		// The budget or the turn ended the call: say so with its cause, never
		// as the tool's failure, whatever the SDK made of it.
		if ctx.Err() != nil {
			cause := context.Cause(ctx)
			if s.cfg.RestartOnIgnoredCancel && l.proc != nil {
				grace := c.KillGrace
				if grace <= 0 {
					grace = s.grace()
				}
				return s.awaitCancel(l, a, t.remote, budget.GraceFor(cause, grace)), cause
			}
			// The SDK writes the cancellation from a goroutine of its own
			// after CallTool returned: wait for it (briefly: a request
			// never sent gets none), so that a turn ending now, and
			// closing the server, does not close its input under it.
			t := time.NewTimer(cancelWriteWait)
			select {
			case <-a.cancelWritten:
			case <-l.done:
			case <-t.C:
			}
			t.Stop()
			if a.answeredFirst.Load() { // its work was over: the cancel came too late
				return nil, cause
			}
			// The server may go on with the call (MCP lets it; keep
			// leaves it be): the model is told so.
			return &tool.Result{StopUnconfirmed: true}, cause
		}
		return nil, s.callError(ctx, l, t.remote, err)
	}
	s.callSucceeded()
	out := resultText(res)
	if res.IsError {
		msg := strings.TrimSpace(string(out))
		if msg == "" {
			msg = "the server reported an error without a message"
		}
		return &tool.Result{Output: out}, &tool.Error{Message: tailString(msg, maxErrorMessage)}
	}
	return &tool.Result{Output: out}, nil
}

// cancelWriteWait bounds how long a stopped call waits for its
// cancellation to be written.
const cancelWriteWait = 500 * time.Millisecond

// detach returns a context for the SDK that is cancelled when ctx is, but
// whose cause is its own. The runner fills in the Elapsed field of a
// timeout cause once the call has returned, while the SDK's goroutines may
// still be formatting the cause of the context they were given (an HTTP
// body read fails with it); a cause of their own keeps them apart.
func detach(ctx context.Context) (context.Context, func()) {
	sdk, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { cancel(errCallStopped) })
	return sdk, func() {
		stop()
		cancel(errCallStopped)
	}
}

var errCallStopped = errors.New("the call was stopped")

// maxErrorMessage bounds the message of an MCP error result; the output
// carries all of it.
const maxErrorMessage = 4 << 10

// active is one call in flight, found by its progress token.
type active struct {
	token    string
	progress tool.Progress
	// cause says why the call's context ended, for the cancellation's
	// reason; it is nil while the call runs.
	cause func() error
	// answered is closed when the server's reply to the call is read,
	// before or after the call was stopped.
	answered   chan struct{}
	answerOnce sync.Once
	// answeredFirst is set when the reply came before the call's
	// cancellation was written.
	answeredFirst atomic.Bool
	// cancelWritten is closed once the call's cancellation has been
	// written (or failed to be).
	cancelWritten chan struct{}
	cancelOnce    sync.Once
}

type activeKey struct{}

func (s *Server) begin(ctx context.Context, c *tool.Call) *active {
	id := c.ID
	if id == "" {
		id = "call"
	}
	p := c.Progress
	if p == nil { // called outside tool.Run
		p = discard{}
	}
	a := &active{token: fmt.Sprintf("%s#%d", id, s.seq.Add(1)), progress: p,
		cause: func() error { return context.Cause(ctx) }, answered: make(chan struct{}), cancelWritten: make(chan struct{})}
	s.calls.Store(a.token, a)
	s.inFlight.Add(1)
	return a
}

// answer notes that the server replied to the call.
func (a *active) answer() { a.answerOnce.Do(func() { close(a.answered) }) }

type discard struct{}

// Report drops the report.
func (discard) Report(tool.Report) {}

// end forgets the call: any progress for its token is now late.
func (s *Server) end(a *active) {
	s.calls.Delete(a.token)
	s.inFlight.Add(-1)
}

// callSucceeded records that the server answered a call, which ends a run of
// failures and its backoff.
func (s *Server) callSucceeded() {
	s.mu.Lock()
	s.failures = 0
	s.mu.Unlock()
}
