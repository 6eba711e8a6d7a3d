package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/mcpserve"
)

const mcpUsage = "usage: timebox mcp serve [-f agent.yaml] [budget flags]   (MCP over stdin and stdout)"

// cmdMCP is `timebox mcp serve`: the agent file's exec tools as one MCP
// server over stdio (docs/mcp-server.md). Standard output carries the
// protocol and nothing else; what timebox has to say goes to standard
// error.
func cmdMCP(ctx context.Context, args []string, o IO) int {
	if len(args) == 0 || args[0] != "serve" {
		if len(args) == 1 && isHelp(args[0]) {
			fmt.Fprintln(o.Out, mcpUsage)
			return ExitOK
		}
		fmt.Fprintln(o.Err, mcpUsage)
		return ExitUsage
	}
	fs, c := newFlags("mcp serve", o)
	pos, err := parse(fs, args[1:])
	if err != nil {
		return usageExit(err)
	}
	if len(pos) != 0 {
		fmt.Fprintln(o.Err, mcpUsage)
		return ExitUsage
	}
	cfg, ok := loadConfig(c, fs, o)
	if !ok {
		return ExitUsage
	}
	// This slice serves exec tools only: an mcp entry's server is left
	// alone (not even started), and the operator is told.
	served := *cfg
	served.Tools = nil
	var skipped []string
	for _, t := range cfg.Tools {
		if t.MCP != nil {
			skipped = append(skipped, t.Name)
			continue
		}
		served.Tools = append(served.Tools, t)
	}
	if len(skipped) > 0 {
		fmt.Fprintf(o.Err, "timebox mcp serve: not serving tools[%s]: the tools of mcp entries are not served yet, only exec tools\n",
			strings.Join(skipped, "], tools["))
	}
	reapOrphans(o)
	ctx, stop := interrupts(ctx, o)
	defer stop()
	// The same build as a turn's: each tool with the budget the loader
	// resolved (its timeout and source, idle timeout, enforcement,
	// kill_grace, flags and environment applied).
	a, err := timebox.Build(ctx, &served, timebox.Options{Getenv: o.getenv})
	if err != nil {
		fmt.Fprintln(o.Err, "timebox:", err)
		return ExitUsage
	}
	defer a.Close()
	s, err := mcpserve.New(a.Tools(), mcpserve.Options{Version: timebox.Version, MaxOutput: a.Limits().MaxToolOutput.N})
	if err != nil {
		fmt.Fprintln(o.Err, "timebox:", err)
		return ExitUsage
	}
	fmt.Fprintf(o.Err, "timebox mcp serve: serving %d tool%s of %s on stdin and stdout\n", len(a.Tools()), plural(len(a.Tools())), cfg.Path)
	err = s.Serve(ctx, &mcp.IOTransport{Reader: io.NopCloser(o.In), Writer: nopWriteCloser{o.Out}})
	switch {
	case ctx.Err() != nil:
		return ExitCancelled
	case err != nil:
		fmt.Fprintln(o.Err, "timebox mcp serve:", err)
		return ExitFailed
	}
	return ExitOK
}

// nopWriteCloser leaves standard output open when the transport closes:
// it is the process's, not the session's.
type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }
