// Package mcpserve serves an agent's tools to any MCP client (spec §15,
// `timebox mcp serve`): each tools/call runs through tool.Run under the
// tool's resolved budget, exactly as a call the model makes in a turn, so
// that a timeout answers as a tool result with isError and the text the
// model would get (never a protocol error), the tool's progress reaches
// the client as notifications/progress, and a client's
// notifications/cancelled stops the call's process tree.
//
// The package takes built tools (agent.Tool, with their budgets); which
// tools to serve and how they are built from an agent file is the
// caller's (internal/cli's `mcp serve` uses timebox.Build).
package mcpserve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/trace"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/ids"
	"github.com/timebox-run/timebox/internal/silentconns"
	"github.com/timebox-run/timebox/tool"
)

// Options are a Server's choices. The zero Options serve every call's
// whole output under the name "timebox".
type Options struct {
	// Name and Version are what the server tells a client it is
	// (serverInfo); "" is "timebox" and no version.
	Name    string
	Version string
	// MaxOutput is the number of bytes of one call's output kept (the
	// agent file's limits.max_tool_output); 0 keeps all of it.
	MaxOutput int64
	// Parallel is the number of calls of one client connection that run
	// at once (the agent file's limits.parallel_tools); 0 is no limit. A
	// call beyond it waits for a slot before it starts, and its budget
	// starts when it does: waiting counts against nothing. A call the
	// client cancels while it waits is answered without running
	// (tool_cancelled, not recorded).
	Parallel int
	// OnFinished, if set, is called once per tools/call the server ran,
	// after the call ended (its processes gone) and before its answer is
	// sent. It is called on the call's goroutine, concurrently for
	// concurrent calls. A call refused before it ran (arguments that fail
	// the tool's schema) does not reach it.
	OnFinished func(Finished)
	// NeedApproval are the names of the tools left out because their calls
	// need a person's approval (Servable's left). A tools/call of one is
	// refused (-32602, as an unknown tool) saying why it is not served and
	// what would serve it, not that no such tool exists.
	NeedApproval []string
	// Logger, if set, receives the MCP SDK's log of the sessions.
	Logger *slog.Logger
	// TracerProvider, if set, traces each call that runs: an execute_tool
	// span, the child of the traceparent the client sent in the request's
	// _meta, whose traceparent the tool is given (docs/mcp-server.md).
	TracerProvider trace.TracerProvider
}

// Finished is how one tools/call went. Record and Turn give it as the
// store keeps it.
type Finished struct {
	// CallID is the id the call ran under (the call_id an exec tool reads
	// on stdin).
	CallID string
	// Tool is the tool's name, as the client called it.
	Tool string
	// Kind is the tool's kind: exec, mcp or go.
	Kind string
	// SessionID names the client's connection the call came on:
	// "mcp_" and a random text, one per connection (a stdio client's
	// whole life; a streamable HTTP client's MCP session).
	SessionID string
	// Arguments are the call's arguments as the tool got them.
	Arguments json.RawMessage
	// Progress are the call's progress reports, coalesced as they were
	// sent upstream, in order.
	Progress []Progress
	// Budget is the budget the call ran under.
	Budget budget.ToolBudget
	// Execution is tool.Run's account of the call.
	Execution *tool.Execution
	// Result is the text the client was answered (tool.ModelResult).
	Result string
}

// Server serves a fixed set of tools. It is safe for concurrent use;
// Serve may be called for several transports at once.
type Server struct {
	opts   Options
	tools  []*entry
	tracer trace.Tracer // nil: not traced
	// conns holds what the server keeps of each client connection:
	// *mcp.ServerSession to *conn.
	conns sync.Map
}

// conn is one client connection's: the id its calls are recorded under
// and its slots (Options.Parallel).
type conn struct {
	id    string
	slots chan struct{} // nil: no limit
}

type entry struct {
	agent.Tool
	spec   tool.Spec
	schema *tool.Schema
	// input is the schema the client is shown: the tool's, an object
	// schema in every case.
	input json.RawMessage
}

// New returns a server of tools, each run under its Budget, which must be
// resolved (agent.Agent.Tools gives them so). It returns an error for a
// tool without a name the model APIs accept, two tools of one name, an
// input schema that does not compile or does not describe an object, or a
// tool whose calls may need a person's approval (Servable leaves those
// out).
func New(tools []agent.Tool, o Options) (*Server, error) {
	s := &Server{opts: o}
	if s.opts.Name == "" {
		s.opts.Name = "timebox"
	}
	if s.opts.TracerProvider != nil {
		s.tracer = s.opts.TracerProvider.Tracer(instrumentation)
	}
	seen := map[string]bool{}
	for _, t := range tools {
		if err := t.Check(); err != nil {
			return nil, fmt.Errorf("mcpserve: %w", err)
		}
		spec := t.Tool.Spec()
		if seen[spec.Name] {
			return nil, fmt.Errorf("mcpserve: two tools are named %q", spec.Name)
		}
		if t.NeedsApproval != nil {
			return nil, fmt.Errorf("mcpserve: tool %s: its calls may need a person's approval, which an MCP client cannot ask for, and it must not run unasked (leave it out: Servable)", spec.Name)
		}
		seen[spec.Name] = true
		sc, err := tool.CompileSchema(spec.InputSchema)
		if err != nil {
			return nil, fmt.Errorf("mcpserve: tool %s: %w", spec.Name, err)
		}
		input, err := objectSchema(spec.InputSchema)
		if err != nil {
			return nil, fmt.Errorf("mcpserve: tool %s: %w", spec.Name, err)
		}
		s.tools = append(s.tools, &entry{Tool: t, spec: spec, schema: sc, input: input})
	}
	return s, nil
}

// Servable returns the tools a server may serve, and the names of those it
// may not: a tool whose calls may need a person's approval
// (agent.Tool.NeedsApproval, docs/approvals.md) cannot be served, since an
// MCP client has no way to route the question to a person, and such a
// tool must not run unasked.
func Servable(tools []agent.Tool) (served []agent.Tool, left []string) {
	for _, t := range tools {
		if t.NeedsApproval != nil {
			left = append(left, t.Tool.Spec().Name)
			continue
		}
		served = append(served, t)
	}
	return served, left
}

// objectSchema returns the input schema a client is shown. MCP requires
// an object schema: an absent one is {"type": "object"} (any object, as
// timebox takes it), and one that leaves out its type gets "object", the
// only input a tool call can have.
func objectSchema(raw json.RawMessage) (json.RawMessage, error) {
	if len(bytes.TrimSpace(raw)) == 0 {
		return json.RawMessage(`{"type":"object"}`), nil
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil || m == nil {
		return nil, errors.New("input_schema is not a JSON object")
	}
	switch typ, ok := m["type"]; {
	case !ok:
		m["type"] = "object"
	case typ != "object":
		return nil, fmt.Errorf(`input_schema has type %v; MCP needs a tool's input to be an object ("type": "object")`, typ)
	default:
		return raw, nil
	}
	return json.Marshal(m)
}

// Serve serves the tools over t until the client closes the connection or
// ctx is done. When ctx is done, every call still running is stopped (as a
// shutdown: its process tree is gone within its kill grace) and Serve
// returns ctx's error once each has answered. A connection the client
// closed returns nil; the calls it left running were stopped as the client
// went away.
func (s *Server) Serve(ctx context.Context, t mcp.Transport) error {
	srv := s.mcpServer(ctx)
	// Run returns once the session's handlers have: each call has
	// answered and its processes are gone.
	err := srv.Run(ctx, t)
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if errors.Is(err, mcp.ErrConnectionClosed) || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// mcpServer returns an SDK server of the tools whose calls are stopped
// as a shutdown when ctx is done.
func (s *Server) mcpServer(ctx context.Context) *mcp.Server {
	srv := mcp.NewServer(&mcp.Implementation{Name: s.opts.Name, Version: s.opts.Version},
		&mcp.ServerOptions{Logger: s.opts.Logger, Capabilities: &mcp.ServerCapabilities{}})
	for _, e := range s.tools {
		srv.AddTool(&mcp.Tool{
			Name: e.spec.Name, Description: e.spec.Description, InputSchema: e.input,
			Meta: mcp.Meta{"timebox/budget": budgetMeta(e.Budget)},
		}, s.handler(ctx, e))
	}
	if len(s.opts.NeedApproval) > 0 {
		srv.AddReceivingMiddleware(s.refuseApprovalTools)
	}
	return srv
}

// refuseApprovalTools answers a call of a tool left out for its approval
// with why, where the SDK would say only that the tool is unknown.
func (s *Server) refuseApprovalTools(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if r, ok := req.(*mcp.CallToolRequest); ok && r.Params != nil && slices.Contains(s.opts.NeedApproval, r.Params.Name) {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf(
				"tool %q is not served: its calls need a person's approval (approval: required in the agent file), which an MCP client cannot ask for, "+
					"and it must not run unasked. Run it in a turn (timebox run, or timebox serve, where a person approves each call), "+
					"or, if it may run unasked, remove approval: required from its entry and restart timebox mcp serve", r.Params.Name)}
		}
		return next(ctx, method, req)
	}
}

// ServeStreamableHTTP serves the tools over MCP's streamable HTTP
// transport on ln (every path) until ctx is done, then stops: ln is
// closed at once, every call still running is stopped as a shutdown (its
// process tree gone within its kill grace) and answered, and it returns
// once every request has ended, with nil, or with the error that stopped
// the listener. ln is closed when it returns.
//
// wrap, if not nil, is put before the MCP handler: the caller's checks of
// a request (a bearer token, the Host and Origin it may have) run first.
// A GET, which would open a stream for messages the server starts, is
// answered 405 Method Not Allowed, as MCP lets a server without such
// messages answer it: every notification of a call (its progress) goes on
// the response to the call's POST. A POST of a JSON-RPC batch under a
// protocol without batches (2025-06-18 and later) is answered 400 with a
// JSON-RPC error (Invalid Request, id null), as Stdio answers such a line.
func (s *Server) ServeStreamableHTTP(ctx context.Context, ln net.Listener, wrap func(http.Handler) http.Handler) error {
	// A listener that fails stops the calls too.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	srv := s.mcpServer(ctx)
	mcpHandler := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv },
		&mcp.StreamableHTTPOptions{Logger: s.opts.Logger})
	var h http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			w.Header().Set("Allow", "POST, DELETE")
			http.Error(w, "this server sends no messages of its own: there is no stream to GET", http.StatusMethodNotAllowed)
			return
		}
		if refuseBatch(w, r) {
			return
		}
		mcpHandler.ServeHTTP(w, r)
	})
	if wrap != nil {
		h = wrap(h)
	}
	hs := &http.Server{
		Handler: h,
		// No WriteTimeout: a call's answer takes as long as its budget.
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	if s.opts.Logger != nil {
		hs.ErrorLog = slog.NewLogLogger(s.opts.Logger.Handler(), slog.LevelWarn)
	}
	silent := silentconns.New()
	hs.ConnState = silent.State
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	var err error
	select {
	case err = <-served:
	case <-ctx.Done():
	}
	cancel()
	silent.Stop()
	// Shutdown closes ln and waits for the requests being answered: the
	// calls among them were stopped when ctx was done (handler) and answer
	// within their kill grace.
	shut := hs.Shutdown(context.Background())
	if err == nil {
		err = <-served
	}
	// The sessions outlive their requests; no request can reach them now.
	for ss := range srv.Sessions() {
		ss.Close()
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return errors.Join(err, shut)
}

// budgetMeta is the tool's budget as a client is shown it in the tool's
// _meta, so that what drives the client (a person, a model) can know how
// long a call may take before it is stopped.
func budgetMeta(b budget.ToolBudget) map[string]any {
	m := map[string]any{
		"timeout_ms":     b.Timeout.MS(),
		"timeout_source": string(b.Timeout.Source),
		"knob":           b.Timeout.Knob,
		"enforcement":    string(b.Enforcement),
		"kill_grace_ms":  b.KillGrace.MS(),
	}
	if b.IdleTimeout.D > 0 {
		m["idle_timeout_ms"] = b.IdleTimeout.MS()
	}
	return m
}

// handler returns the tools/call handler of e. A call runs under a
// context of its own: the request's cancellation (the client's
// notifications/cancelled, or the client going away) and serve's end
// become a cancellation cause the call's record and result can name.
func (s *Server) handler(serveCtx context.Context, e *entry) mcp.ToolHandler {
	name := e.spec.Name
	return func(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		args := req.Params.Arguments
		if err := e.schema.Check(args); err != nil {
			var ae *tool.ArgumentError
			errors.As(err, &ae)
			return textResult(tool.Refusal(name, ae.Reason, ae.Field, ae.Message+" The tool was not run."), true), nil
		}
		if len(bytes.TrimSpace(args)) == 0 {
			args = json.RawMessage("{}")
		}
		cn := s.conn(req.Session)
		release, why := cn.acquire(ctx, serveCtx)
		if release == nil {
			return textResult(tool.Refusal(name, "cancelled", "", fmt.Sprintf(
				"Not run: %s while it waited for one of the %d calls a client may run at once (limits.parallel_tools).", why, s.opts.Parallel)), true), nil
		}
		defer release()

		callCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
		defer cancel(nil)
		stopReq := context.AfterFunc(ctx, func() {
			if context.Cause(ctx) == context.Canceled {
				cancel(&budget.CancelError{Reason: budget.Cancelled, By: "the MCP client"})
			} else { // the connection broke: jsonrpc2 cancels with its error
				cancel(&budget.CancelError{Reason: budget.ClientGone, By: "the MCP client"})
			}
		})
		defer stopReq()
		stopServe := context.AfterFunc(serveCtx, func() {
			cancel(&budget.CancelError{Reason: budget.Shutdown, By: "the server"})
		})
		defer stopServe()

		callID := ids.New("call_")
		span, traceparent := s.startSpan(req.Params.Meta, e, callID, cn.id)
		var h tool.Hooks
		var reports []Progress
		var up *upstream
		if token := req.Params.GetProgressToken(); token != nil {
			up = &upstream{token: token}
		}
		h.OnProgress = func(r tool.Report) {
			// Run calls OnProgress one report at a time and has every call
			// return before it does, so reports needs no lock and no
			// notification follows the answer.
			reports = append(reports, Progress{At: time.Now(), Report: r})
			progressEvent(span, r)
			// A client that cancelled gets none: ctx is done.
			if up != nil && ctx.Err() == nil {
				_ = req.Session.NotifyProgress(ctx, up.params(r))
			}
		}
		x := tool.Run(callCtx, e.Tool.Tool, &tool.Call{ID: callID, Tool: name, Input: args, MaxOutput: s.opts.MaxOutput,
			TraceParent: traceparent}, e.Budget, h)
		text := tool.ModelResult(name, e.Budget, x)
		f := Finished{CallID: callID, Tool: name, Kind: string(e.Tool.Tool.Kind()), SessionID: cn.id,
			Arguments: args, Progress: reports, Budget: e.Budget, Execution: x, Result: text}
		endSpan(span, f.Record(""))
		if s.opts.OnFinished != nil {
			s.opts.OnFinished(f)
		}
		// A timeout, a tool error and a cancellation are all tool results,
		// never protocol errors: the client's model reads them as the
		// agent's model would. A cancelled call's answer is sent, as the
		// SDK sends every handler's; a client that cancelled ignores it.
		return textResult(text, x.Outcome != event.OutcomeOK), nil
	}
}

// conn returns what the server keeps of connection ss. Its id, the id
// its calls are recorded under, is "mcp_" and the MCP session id a
// streamable HTTP connection has, or, for a connection without one
// (stdio), a random one of its own.
func (s *Server) conn(ss *mcp.ServerSession) *conn {
	if c, ok := s.conns.Load(ss); ok {
		return c.(*conn)
	}
	c := &conn{id: ids.New("mcp_")}
	if id := ss.ID(); id != "" {
		c.id = "mcp_" + id
	}
	if s.opts.Parallel > 0 {
		c.slots = make(chan struct{}, s.opts.Parallel)
	}
	got, loaded := s.conns.LoadOrStore(ss, c)
	if !loaded {
		// Forgotten when the connection ends (Serve ends every one), so
		// that a long-lived HTTP server does not keep every client's.
		go func() {
			_ = ss.Wait()
			s.conns.Delete(ss)
		}()
	}
	return got.(*conn)
}

// acquire waits for one of c's slots; it returns the function that frees
// it, or the reason the call is not run: the client cancelled it, or the
// server is stopping.
func (c *conn) acquire(ctx, serveCtx context.Context) (release func(), cancelled string) {
	if c.slots == nil {
		return func() {}, ""
	}
	select {
	case c.slots <- struct{}{}:
		return func() { <-c.slots }, ""
	case <-ctx.Done():
		return nil, "the MCP client cancelled it"
	case <-serveCtx.Done():
		return nil, "the server is stopping"
	}
}

func textResult(text string, isError bool) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, IsError: isError}
}

// upstream turns a call's coalesced progress reports into MCP progress
// notifications on one token. MCP wants the progress value to increase
// with every notification; a tool's reports need not (a message alone, a
// phase that starts again from 0). A report whose progress goes up is sent
// as it is, with its total; any other is sent as one more than the last
// value (the first as 0), without a total, which it may no longer be
// measured against.
// OnProgress calls it one report at a time, so it needs no lock.
type upstream struct {
	token any
	sent  bool
	last  float64
}

func (u *upstream) params(r tool.Report) *mcp.ProgressNotificationParams {
	p := &mcp.ProgressNotificationParams{ProgressToken: u.token, Message: r.Message}
	if r.Progress != nil && (!u.sent || *r.Progress > u.last) {
		p.Progress = *r.Progress
		if r.Total != nil && *r.Total >= p.Progress {
			p.Total = *r.Total
		}
	} else if u.sent {
		p.Progress = u.last + 1
	} // else the first report, without a number: 0
	u.sent, u.last = true, p.Progress
	return p
}
