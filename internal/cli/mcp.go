package cli

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/mcpserve"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
)

// cmdMCP is `timebox mcp serve`: the agent file's tools (its exec tools
// and the tools of its mcp entries) as one MCP server over stdio
// (docs/mcp-server.md). Standard output carries the protocol and nothing
// else; what timebox has to say goes to standard
// error. With --addr it serves the same tools over MCP's streamable HTTP
// transport instead, under serve's rules: a non-loopback address needs a
// token, a token is asked of every request, and another Host or Origin is
// refused (server.CheckAddr, server.Guard).
func cmdMCP(ctx context.Context, args []string, o IO) int {
	if len(args) == 0 || args[0] != "serve" {
		if len(args) == 1 && isHelp(args[0]) {
			fmt.Fprintln(o.Out, synopses["mcp serve"])
			return ExitOK
		}
		if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
			fmt.Fprintln(o.Err, unknownWord("mcp", args[0], []string{"serve"}))
		}
		fmt.Fprintln(o.Err, synopses["mcp serve"])
		return ExitUsage
	}
	fs, c := newFlags("mcp serve", o)
	addr := fs.String("addr", "", "serve MCP's streamable HTTP transport on this address instead of stdio; a non-loopback address needs a token")
	tokenFlag := fs.String("token", "", "with --addr: require \"Authorization: Bearer TOKEN\" on every request (env TIMEBOX_TOKEN, which ps does not show)")
	// Recording the calls: docs/decisions/mcp-server-records.md.
	db := fs.String("db", "", `store each call, for timebox runs and stats: a SQLite file or a postgres:// URL (env TIMEBOX_DB; default `+stateDB(o)+`; "" stores nothing)`)
	noStore := fs.Bool("no-store", false, "do not store the calls")
	pos, err := parse(fs, args[1:])
	if err != nil {
		return usageExit(err)
	}
	if len(pos) != 0 {
		fmt.Fprintln(o.Err, synopses["mcp serve"])
		return ExitUsage
	}
	var token string
	if *addr != "" {
		// Checked before anything starts: a server anyone can reach must
		// not run the tools for anyone.
		var ok bool
		if token, ok = serveToken(fs, *tokenFlag, o); !ok {
			return ExitUsage
		}
		if err := server.CheckAddr(*addr, token); err != nil {
			fmt.Fprintln(o.Err, "timebox mcp serve:", err)
			return ExitUsage
		}
	} else if *tokenFlag != "" {
		fmt.Fprintln(o.Err, "timebox mcp serve: --token is for --addr: over stdio, the client that starts the server is the only one it answers")
		return ExitUsage
	}
	cfg, ctx, stop, ok := loadToRun(ctx, c, fs, o)
	if !ok {
		return ExitUsage
	}
	defer stop()
	// The same build as a turn's: each tool with the budget the loader
	// resolved (its timeout and source, idle timeout, enforcement,
	// kill_grace, flags and environment applied). An mcp entry's server is
	// started, and its tools are served under the names a turn's model
	// sees (entry__tool, docs/decisions/mcp-tool-names.md), each with its
	// entry's budget or its override; a.Close stops the servers.
	a, err := timebox.Build(ctx, cfg, timebox.Options{Getenv: o.getenv})
	if err != nil {
		fmt.Fprintln(o.Err, "timebox:", err)
		return ExitUsage
	}
	defer a.Close()
	// Traced as a turn's calls are, when the OTEL_EXPORTER_OTLP_*
	// variables are set.
	tracing, ok := startTracing(ctx, o)
	if !ok {
		return ExitUsage
	}
	defer stopTracing(tracing, o)
	opts := mcpserve.Options{Version: timebox.Version, MaxOutput: a.Limits().MaxToolOutput.N, Parallel: int(a.Limits().ParallelTools.N),
		TracerProvider: tracing.Provider}
	if rec := openMCPRecords(fs, *db, *noStore, cfg.Name, o, tracedEnds(tracing)); rec != nil {
		defer rec.close(o)
		opts.OnFinished = rec.finished
	}
	tools, needApproval := servedTools(a.Tools(), o)
	opts.NeedApproval = needApproval
	s, err := mcpserve.New(tools, opts)
	if err != nil {
		fmt.Fprintln(o.Err, "timebox:", err)
		return ExitUsage
	}
	if *addr != "" {
		return serveMCPHTTP(ctx, s, *addr, token, len(tools), cfg.Path, o)
	}
	fmt.Fprintf(o.Err, "timebox mcp serve: serving %d tool%s of %s on stdin and stdout\n", len(tools), plural(len(tools)), cfg.Path)
	// The end of stdin ends the requests: those read are answered first.
	// A client whose end of stdout is gone reads no answer, so its calls
	// are stopped then (docs/decisions/mcp-stdin-eof.md).
	outGone := make(chan struct{})
	var goneOnce sync.Once
	defer watchReader(o.Out, func() { goneOnce.Do(func() { close(outGone) }) })()
	err = s.Serve(ctx, mcpserve.Stdio(o.In, o.Out, outGone))
	switch {
	case ctx.Err() != nil:
		return ExitCancelled
	case err != nil:
		fmt.Fprintln(o.Err, "timebox mcp serve:", err)
		return ExitFailed
	}
	return ExitOK
}

// serveMCPHTTP serves s over MCP's streamable HTTP transport on addr until
// ctx is done (SIGTERM, Ctrl-C): then the calls still running are stopped,
// their trees gone, and answered before it returns ExitCancelled, as the
// stdio mode does.
func serveMCPHTTP(ctx context.Context, s *mcpserve.Server, addr, token string, tools int, file string, o IO) int {
	ln, err := listen(addr, "--addr")
	if err != nil {
		fmt.Fprintln(o.Err, "timebox mcp serve:", err)
		return ExitFailed
	}
	fmt.Fprintf(o.Out, "timebox serving %d tool%s of %s over MCP on http://%s/mcp\n", tools, plural(tools), file, ln.Addr())
	if token == "" {
		fmt.Fprintln(o.Out, "no token: only this machine can reach it (set --token or TIMEBOX_TOKEN to serve others)")
	}
	err = s.ServeStreamableHTTP(ctx, ln, func(h http.Handler) http.Handler { return server.Guard(token, h) })
	switch {
	case err != nil:
		fmt.Fprintln(o.Err, "timebox mcp serve:", err)
		return ExitFailed
	case ctx.Err() != nil:
		fmt.Fprintln(o.Err, "timebox mcp serve: stopped")
		return ExitCancelled
	}
	return ExitOK
}

// mcpRecords stores each call `timebox mcp serve` answers as a turn of
// its own in the session of the client's connection
// (docs/decisions/mcp-server-records.md), written after the call ended
// and without holding its answer: the client never waits for the disk.
type mcpRecords struct {
	st    store.Store
	agent string
	o     IO

	wg     sync.WaitGroup
	warned atomic.Bool
}

// openMCPRecords opens the store `timebox mcp serve` writes to, as
// `timebox run` does: --db, else TIMEBOX_DB, else the default store;
// nothing with --no-store or --db "". A store that cannot be opened is a
// warning: serving the tools is what the user asked for.
func openMCPRecords(fs *flag.FlagSet, db string, noStore bool, agentName string, o IO, ended func(store.Ending)) *mcpRecords {
	path := setting(fs, "db", db, "TIMEBOX_DB", o, stateDB(o))
	if noStore || path == "" {
		return nil
	}
	st, err := openStore(path, false, o, ended)
	if err != nil {
		fmt.Fprintf(o.Err, "warning: %v; the calls will not be stored (--no-store silences this)\n", err)
		return nil
	}
	return &mcpRecords{st: st, agent: agentName, o: o}
}

// finished is the server's OnFinished: it stores the call's turn on a
// goroutine of its own.
func (r *mcpRecords) finished(f mcpserve.Finished) {
	t := f.Turn(r.agent)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		if err := r.st.FinishTurn(context.Background(), t, nil); err != nil && !r.warned.Swap(true) {
			fmt.Fprintf(r.o.Err, "warning: storing the call %s of %s: %v (further failures are not shown)\n", f.CallID, f.Tool, err)
		}
	}()
}

// mcpRecordsWait is how long close waits for the calls' records before it
// closes the store, which ends the writes still retrying.
const mcpRecordsWait = 10 * time.Second

// close waits for the records being written, then closes the store.
func (r *mcpRecords) close(o IO) {
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(mcpRecordsWait):
		fmt.Fprintf(o.Err, "warning: the store has not taken every call's record after %s; closing it\n", mcpRecordsWait)
	}
	if err := r.st.Close(); err != nil {
		fmt.Fprintf(o.Err, "warning: closing the store: %v\n", err)
	}
	<-done
}

// servedTools leaves out the tools whose calls need a person's approval
// (docs/approvals.md), saying so: an MCP client has no way to route
// timebox's question to a person, and such a tool must not run unasked.
// It returns the tools served and the names of those left out.
func servedTools(all []agent.Tool, o IO) ([]agent.Tool, []string) {
	out, left := mcpserve.Servable(all)
	if len(left) > 0 {
		fmt.Fprintf(o.Err, "timebox mcp serve: not serving %s: %s approval (approval: required), which an MCP client cannot ask a person for\n",
			strings.Join(left, ", "), map[bool]string{true: "its calls need", false: "their calls need"}[len(left) == 1])
	}
	return out, left
}
