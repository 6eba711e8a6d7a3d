// Package mcptest is a stdio MCP server for tests, built with the official
// Go SDK: a test binary re-executes itself as the server (Serving, Serve),
// so that tests talk to a real process over the real wire format without
// npm. Its tools are the kinds of server behaviour timebox must cope with:
//
//   - echo answers at once with the server's pid, so that a test can tell
//     a fresh server from the old one;
//   - polite reports progress once ("started"), runs until it is
//     cancelled, then answers (as the Go SDK answers every request);
//   - stubborn ignores its cancellation: it goes on reporting progress
//     every 100ms for 5 minutes, with a child process (sleep 300) in a
//     session of its own, whose pid and its own it appends to the file
//     named by EnvPids;
//   - busy blocks the server's reading for 27 seconds, as a tool that
//     blocks a server's event loop does (pings go unanswered), reporting
//     progress every second, then answers;
//   - noise writes a line that is not JSON-RPC to stdout, then answers
//     "after the noise", as a server that logs to stdout by mistake does;
//   - garble writes a line that starts as JSON and is not, then hangs;
//   - big answers with {"bytes": N} bytes of text;
//   - late answers {"ms": N} milliseconds after it started, cancelled or
//     not, as a server whose work was nearly done when it was cancelled does.
//
// With EnvBanner set, the server first prints that line to stdout. With
// EnvOld set, it never answers server/discover, as a server written before
// that method existed, which ignores requests it does not know, does.
package mcptest

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// EnvServe, set to "1" in a re-executed test binary's environment, makes
// Serving true.
const EnvServe = "MCPTEST_SERVE"

// EnvPids names the file stubborn appends its pids to (the server's, then
// its child's), one a line.
const EnvPids = "MCPTEST_PIDS"

// EnvBanner, when set, is a line the server prints to stdout before it
// serves, as a server that greets its user there does.
const EnvBanner = "MCPTEST_BANNER"

// EnvOld, set to "1", makes the server drop every server/discover request
// it reads, unanswered.
const EnvOld = "MCPTEST_OLD"

// Serving reports whether this process was started to be the server: a
// TestMain calls Serve, and nothing else, when it is.
func Serving() bool { return os.Getenv(EnvServe) == "1" }

// Command returns the argv that starts the server: the running test
// binary, which serves when its environment has EnvServe=1 (and EnvPids
// for stubborn): set them in the environment the server inherits.
func Command() []string {
	exe, err := os.Executable()
	if err != nil {
		panic(err)
	}
	return []string{exe}
}

// Serve serves the tools on stdin and stdout until the client closes
// stdin, then exits the process.
func Serve() {
	s := mcp.NewServer(&mcp.Implementation{Name: "mcptest", Version: "1"}, nil)
	type none struct{}
	mcp.AddTool(s, &mcp.Tool{Name: "echo", Description: "Answers with the server's pid."},
		func(context.Context, *mcp.CallToolRequest, none) (*mcp.CallToolResult, any, error) {
			return text(strconv.Itoa(os.Getpid())), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "polite", Description: "Runs until cancelled, then answers."},
		func(ctx context.Context, req *mcp.CallToolRequest, _ none) (*mcp.CallToolResult, any, error) {
			if token := req.Params.GetProgressToken(); token != nil {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Message: "started"})
			}
			<-ctx.Done()
			return text("stopped"), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "stubborn", Description: "Ignores its cancellation and works on for 5 minutes."},
		func(ctx context.Context, req *mcp.CallToolRequest, _ none) (*mcp.CallToolResult, any, error) {
			child := exec.Command("sleep", "300")
			escape(child)
			if err := child.Start(); err == nil {
				if f, err := os.OpenFile(os.Getenv(EnvPids), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
					fmt.Fprintf(f, "%d\n%d\n", os.Getpid(), child.Process.Pid)
					f.Close()
				}
			}
			token := req.Params.GetProgressToken()
			for i := range 3000 {
				time.Sleep(100 * time.Millisecond)
				if token != nil {
					// On a context of its own: the call's is cancelled, and
					// this server goes on regardless.
					_ = req.Session.NotifyProgress(context.Background(), &mcp.ProgressNotificationParams{
						ProgressToken: token, Progress: float64(i + 1), Message: "still working"})
				}
			}
			return text("done"), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "busy", Description: "Blocks the server's reading for 27s, reporting progress, then answers."},
		func(ctx context.Context, req *mcp.CallToolRequest, _ none) (*mcp.CallToolResult, any, error) {
			const busyFor = 27
			in.block(busyFor * time.Second)
			token := req.Params.GetProgressToken()
			for i := range busyFor {
				time.Sleep(time.Second)
				if token != nil {
					_ = req.Session.NotifyProgress(context.Background(), &mcp.ProgressNotificationParams{
						ProgressToken: token, Progress: float64(i + 1), Total: busyFor, Message: "busy"})
				}
			}
			return text("done"), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "noise", Description: "Writes a line that is not JSON-RPC to stdout, then answers."},
		func(context.Context, *mcp.CallToolRequest, none) (*mcp.CallToolResult, any, error) {
			out.write("Processing request... done\n")
			return text("after the noise"), nil, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "garble", Description: "Writes a broken JSON line to stdout, then hangs."},
		func(ctx context.Context, _ *mcp.CallToolRequest, _ none) (*mcp.CallToolResult, any, error) {
			out.write("{\"jsonrpc\": \"2.0\", oops}\n")
			<-ctx.Done()
			return text("stopped"), nil, nil
		})
	type size struct {
		Bytes int `json:"bytes"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "big", Description: "Answers with that many bytes."},
		func(_ context.Context, _ *mcp.CallToolRequest, a size) (*mcp.CallToolResult, any, error) {
			return text(strings.Repeat("x", a.Bytes)), nil, nil
		})
	type after struct {
		MS int `json:"ms"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "late", Description: "Answers after that many milliseconds, cancelled or not."},
		func(_ context.Context, _ *mcp.CallToolRequest, a after) (*mcp.CallToolResult, any, error) {
			time.Sleep(time.Duration(a.MS) * time.Millisecond)
			return text("late"), nil, nil
		})
	if b := os.Getenv(EnvBanner); b != "" {
		out.write(b + "\n")
	}
	var r io.ReadCloser = in
	if os.Getenv(EnvOld) == "1" {
		r = &dropReader{r: bufio.NewReader(in), c: in, method: []byte(`"method":"server/discover"`)}
	}
	_ = s.Run(context.Background(), &mcp.IOTransport{Reader: r, Writer: out})
	os.Exit(0)
}

// in is the server's stdin, which busy blocks.
var in = &gatedReader{r: os.Stdin}

// gatedReader hands on what it reads only once its gate is open.
type gatedReader struct {
	r     io.ReadCloser
	mu    sync.Mutex
	until time.Time
}

func (g *gatedReader) block(d time.Duration) {
	g.mu.Lock()
	g.until = time.Now().Add(d)
	g.mu.Unlock()
}

func (g *gatedReader) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	g.mu.Lock()
	until := g.until
	g.mu.Unlock()
	time.Sleep(time.Until(until))
	return n, err
}

func (g *gatedReader) Close() error { return g.r.Close() }

// dropReader hands on the lines it reads, except those that contain method.
type dropReader struct {
	r      *bufio.Reader
	c      io.Closer
	method []byte
	rest   []byte // what is left of the line being handed on
}

func (d *dropReader) Read(p []byte) (int, error) {
	for len(d.rest) == 0 {
		line, err := d.r.ReadBytes('\n')
		if !bytes.Contains(line, d.method) {
			d.rest = line
		}
		if err != nil && len(d.rest) == 0 {
			return 0, err
		}
	}
	n := copy(p, d.rest)
	d.rest = d.rest[n:]
	return n, nil
}

func (d *dropReader) Close() error { return d.c.Close() }

// out is the server's stdout, shared by the SDK's messages and the
// tools' stray lines, a line at a time.
var out = &lockedStdout{}

type lockedStdout struct{ mu sync.Mutex }

func (o *lockedStdout) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return os.Stdout.Write(p)
}

func (o *lockedStdout) write(s string) { _, _ = o.Write([]byte(s)) }

func (*lockedStdout) Close() error { return nil }

func text(s string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: s}}}
}
