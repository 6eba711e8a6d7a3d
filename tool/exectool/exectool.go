// Package exectool runs a program as a tool (spec §9, kind exec) and owns
// its whole process tree while it runs (spec §3).
//
// The protocol: the program gets one JSON object on stdin,
//
//	{"tool": "crawl", "call_id": "c1", "input": {...},
//	 "deadline": "2025-01-02T15:04:05.123456789Z", "timeout_ms": 30000}
//
// followed by a newline and EOF ("deadline" and "timeout_ms" are left out
// when the call has no timeout). Its stdout is the result, JSON or plain
// text. Its stderr is its log, except lines of the form
//
//	::progress:: {"progress": 3, "total": 10, "message": "fetching page 3"}
//
// which are progress reports (every field optional; "::progress:: some
// text" and a bare "::progress::" are reports too). Exit status 0 is
// success; anything else is the tool's own failure, a *tool.Error.
//
// When the call's context is done the program's whole tree is stopped —
// SIGTERM, then SIGKILL after the grace — and no process of it survives,
// including ones that started their own session or were double-forked
// (internal/proctree). Processes the program leaves behind when it exits on
// its own are part of the call too and are killed when it ends.
package exectool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/proctree"
	"github.com/timebox-run/timebox/tool"
	"github.com/timebox-run/timebox/tool/runas"
)

// DefaultMaxOutput is the output cap of a call that names none, the spec's
// default for limits.max_tool_output.
const DefaultMaxOutput = 1 << 20

// drainAfterExit bounds how long a call keeps reading stdout and stderr
// once every process of its tree is gone. What the tree wrote is already in
// the pipes and is read at once; the bound only matters if a process
// outside the tree holds a pipe open (a privileged tool that moved a
// process out of its cgroup), which must not hang the call.
const drainAfterExit = 250 * time.Millisecond

// Config is an exec tool's configuration. The zero values of the optional
// fields are useful: the whole environment, timebox's own working
// directory, a 1 MiB output cap, the process-tree strategy chosen by
// TIMEBOX_PROCTREE or detection.
type Config struct {
	// Spec is what the model is told about the tool.
	Spec tool.Spec
	// Argv is the program and its arguments. It is run directly, never
	// through a shell. A program name without a slash is looked up in
	// timebox's PATH at each call; a relative path with a slash is taken
	// relative to Workdir.
	Argv []string
	// Env is the allowlist of environment variable names the program
	// inherits (with their values in timebox's environment when the call
	// starts). Nil means the whole environment but Withhold; an empty,
	// non-nil list means none. TIMEBOX_CALL, the process-tree marker, is
	// always set.
	Env []string
	// Withhold names the variables the program does not inherit when Env
	// is nil: timebox's own secrets (config.Agent.Withheld).
	Withhold []string
	// User, when set, is who the program runs as (tools[].user).
	User *runas.Identity
	// Workdir is the program's working directory; empty is timebox's own.
	Workdir string
	// MaxOutput is the number of stdout bytes kept when the call does not
	// set tool.Call.MaxOutput; zero means DefaultMaxOutput. The rest is
	// read and discarded, so that the program never blocks on a full pipe.
	MaxOutput int64
	// ProcTree is how the call's process tree is owned; zero (or
	// proctree.Auto) defers to TIMEBOX_PROCTREE, then to detection.
	ProcTree proctree.Strategy
}

// Tool is an exec tool. It is safe for concurrent calls; each call runs its
// own process tree.
type Tool struct {
	cfg Config
}

// New returns the tool for cfg. It copies cfg, so later changes to the
// caller's slices do not reach it. It returns an error for an empty Argv
// or program name, an Env entry that is not a plain variable name, a
// negative MaxOutput, and an unknown ProcTree strategy.
func New(cfg Config) (*Tool, error) {
	if len(cfg.Argv) == 0 || cfg.Argv[0] == "" {
		return nil, errors.New("exec needs a program to run (exec: [./tools/x.sh, --flag])")
	}
	for _, name := range cfg.Env {
		if name == "" || strings.ContainsAny(name, "=\x00") {
			return nil, fmt.Errorf("env: %q is not a variable name", name)
		}
	}
	if cfg.MaxOutput < 0 {
		return nil, fmt.Errorf("max output %d is negative", cfg.MaxOutput)
	}
	if _, err := proctree.ParseStrategy(string(cfg.ProcTree)); err != nil {
		return nil, err
	}
	cfg.Argv = append([]string(nil), cfg.Argv...)
	if cfg.Env != nil {
		cfg.Env = append([]string{}, cfg.Env...)
	}
	cfg.Withhold = append([]string(nil), cfg.Withhold...)
	cfg.Spec.InputSchema = append(json.RawMessage(nil), cfg.Spec.InputSchema...)
	return &Tool{cfg: cfg}, nil
}

// Spec returns what the model is told about the tool.
func (t *Tool) Spec() tool.Spec { return t.cfg.Spec }

// Kind returns tool.KindExec.
func (t *Tool) Kind() tool.Kind { return tool.KindExec }

// request is the object a program reads from stdin.
type request struct {
	Tool      string          `json:"tool"`
	CallID    string          `json:"call_id"`
	Input     json.RawMessage `json:"input"`
	Deadline  string          `json:"deadline,omitempty"`
	TimeoutMS int64           `json:"timeout_ms,omitempty"`
}

// Call runs the program once for c (see the package documentation for the
// protocol). It returns:
//
//   - on exit status 0: the result and nil;
//   - on another exit, or death by a signal nobody in timebox sent: the
//     result so far (partial stdout, exit code, stderr tail) and a
//     *tool.Error whose message is the last line of the log;
//   - when the program cannot be started (not found, not executable): a
//     *tool.Error saying so;
//   - when ctx is done first: the result so far and context.Cause(ctx),
//     after the whole tree was stopped (SIGTERM; SIGKILL after
//     budget.GraceFor(cause, c.KillGrace)) and every process of it is gone.
//
// In every case, when Call returns no process of the call is alive, but
// for one the kernel keeps in uninterruptible sleep after SIGKILL: Call
// waits 5s for it, then returns and says so at the end of StderrTail.
//
// A call whose context is done before its process could be started (the
// deadline passed while it waited for its turn to fork) starts nothing
// and returns context.Cause(ctx).
func (t *Tool) Call(ctx context.Context, c *tool.Call) (*tool.Result, error) {
	if ctx.Err() != nil {
		return nil, context.Cause(ctx)
	}
	payload, err := t.request(c)
	if err != nil {
		return nil, &tool.Error{Message: err.Error()}
	}

	// A name without a slash is looked up in PATH now, so that a program
	// installed after timebox started is found; a relative path with a
	// slash is taken relative to Dir by os/exec.
	cmd := exec.Command(t.cfg.Argv[0], t.cfg.Argv[1:]...)
	cmd.Dir = t.cfg.Workdir
	cmd.Env = t.environ()
	if c.TraceParent != "" {
		cmd.Env = tool.WithTraceParent(cmd.Env, c.TraceParent)
	}
	if t.cfg.User != nil {
		if err := t.cfg.User.Apply(cmd); err != nil {
			return nil, &tool.Error{Message: err.Error()}
		}
	}

	p, err := newPipes()
	if err != nil {
		return nil, &tool.Error{Message: fmt.Sprintf("cannot start %s: %v", t.cfg.Argv[0], err)}
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = p.childIn, p.childOut, p.childErr
	tree, err := proctree.Start(ctx, cmd, t.cfg.ProcTree)
	p.closeChildEnds()
	if err != nil {
		p.closeParentEnds()
		if errors.Is(err, proctree.ErrNotStarted) {
			// The deadline (or a cancellation) came while the call waited
			// to be started: it ends as stopped, having started nothing.
			return nil, context.Cause(ctx)
		}
		return nil, &tool.Error{Message: startError(t.cfg.Argv[0], err)}
	}

	out := &capped{max: t.maxOutput(c)}
	log := &stderrLog{progress: c.Progress}
	var wg sync.WaitGroup
	wg.Go(func() {
		// A program that never reads stdin makes this fail with EPIPE
		// once it is gone; that is not an error of the call.
		p.in.Write(payload)
		p.in.Close()
	})
	wg.Go(func() { out.drain(p.out) })
	wg.Go(func() { log.drain(p.err) })

	stopped := false
	select {
	case <-tree.Exited():
	case <-ctx.Done():
		select {
		case <-tree.Exited():
			// It finished at the same instant: its result counts, as the
			// runner uses a completed result even when a budget fired.
		default:
			stopped = true
			tree.Stop(budget.GraceFor(context.Cause(ctx), c.KillGrace))
		}
	}
	waitErr := tree.Wait()
	// Every process of the tree is gone, so nothing can write any more:
	// what is buffered is read at once and then the pipes are at EOF.
	deadline := time.Now().Add(drainAfterExit)
	p.out.SetReadDeadline(deadline)
	p.err.SetReadDeadline(deadline)
	p.in.SetWriteDeadline(deadline) // fails harmlessly once the writer closed it
	wg.Wait()
	p.out.Close()
	p.err.Close()

	output, truncated, end := out.result()
	res := &tool.Result{Output: output, Truncated: truncated, OutputTail: end, StderrTail: log.tail()}
	if pids := tree.Escaped(); len(pids) > 0 {
		res.StderrTail = note(res.StderrTail, fmt.Sprintf("timebox: process %s had left the call's cgroup (a privileged process can move itself); found by the call's marker and stopped with the call",
			pidList(pids)))
	}
	if pids := tree.Unkilled(); len(pids) > 0 {
		res.StderrTail = note(res.StderrTail, fmt.Sprintf("timebox: process %s did not exit after %s; it runs no more code and will exit when the kernel lets it go",
			pidList(pids), forceStop))
	}
	var code *int
	if ps := cmd.ProcessState; ps != nil {
		if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Exited() {
			n := ws.ExitStatus()
			code = &n
		}
	}
	res.ExitCode = code
	if stopped {
		return res, context.Cause(ctx)
	}
	if waitErr == nil {
		return res, nil
	}
	msg := log.lastLine()
	var ee *exec.ExitError
	switch {
	case code != nil:
		if what := exitNote(*code); what != "" {
			msg = note2(what, msg)
		} else if msg == "" {
			msg = "the tool wrote nothing to stderr"
		}
	case errors.As(waitErr, &ee):
		what := "killed by a signal"
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			what = "killed by " + signalName(ws.Signal())
		}
		msg = note2(what, msg)
	default:
		msg = waitErr.Error()
	}
	return res, &tool.Error{Message: msg, ExitCode: code, StderrTail: res.StderrTail}
}

// OwnsProcesses marks the tool as one whose Call stops every process it
// started before it returns (tool.ProcessOwner): the runner waits for a
// stopped call instead of abandoning it.
func (t *Tool) OwnsProcesses() {}

// note adds a line of timebox's own to a call's stderr tail.
func note(tail, line string) string {
	if tail != "" && !strings.HasSuffix(tail, "\n") {
		tail += "\n"
	}
	return tail + line
}

// note2 returns what, followed by the tool's own last line when there is one.
func note2(what, msg string) string {
	if msg == "" {
		return what
	}
	return what + ": " + msg
}

func pidList(pids []int) string {
	s := make([]string, len(pids))
	for i, pid := range pids {
		s[i] = strconv.Itoa(pid)
	}
	return strings.Join(s, ", ")
}

// request returns the stdin payload of call c.
func (t *Tool) request(c *tool.Call) ([]byte, error) {
	r := request{Tool: c.Tool, CallID: c.ID, Input: c.Input}
	if r.Tool == "" {
		r.Tool = t.cfg.Spec.Name
	}
	if len(strings.TrimSpace(string(r.Input))) == 0 {
		r.Input = json.RawMessage("{}")
	}
	if !c.Deadline.IsZero() {
		r.Deadline = c.Deadline.UTC().Format(time.RFC3339Nano)
	}
	if c.Timeout > 0 {
		r.TimeoutMS = c.Timeout.Milliseconds()
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("the call's input is not JSON: %v", err)
	}
	return append(b, '\n'), nil
}

// environ returns the program's environment (tool.Environ); proctree adds
// the marker.
func (t *Tool) environ() []string { return tool.Environ(t.cfg.Env, t.cfg.Withhold) }

func (t *Tool) maxOutput(c *tool.Call) int64 {
	switch {
	case c.MaxOutput > 0:
		return c.MaxOutput
	case t.cfg.MaxOutput > 0:
		return t.cfg.MaxOutput
	}
	return DefaultMaxOutput
}

// startError says why a program could not be started, for the model and
// the person reading the record.
func startError(prog string, err error) string {
	switch {
	case errors.Is(err, exec.ErrNotFound):
		return fmt.Sprintf("cannot start %s: no such program in PATH", prog)
	case errors.Is(err, os.ErrNotExist):
		return fmt.Sprintf("cannot start %s: no such file (or its working directory or interpreter is missing)", prog)
	case errors.Is(err, os.ErrPermission):
		return fmt.Sprintf("cannot start %s: permission denied (is it executable?)", prog)
	case errors.Is(err, syscall.ENOEXEC):
		return fmt.Sprintf("cannot start %s: not an executable format (a script needs a #! line)", prog)
	}
	return fmt.Sprintf("cannot start %s: %v", prog, err)
}

// pipes are a call's stdin, stdout and stderr. os.Pipe's parent ends are
// non-blocking and registered with Go's poller, so reads take deadlines
// and a blocked write ends when the reader goes away.
type pipes struct {
	in                          *os.File // parent writes the request
	out, err                    *os.File // parent reads
	childIn, childOut, childErr *os.File
}

func newPipes() (*pipes, error) {
	var p pipes
	var err error
	if p.childIn, p.in, err = os.Pipe(); err != nil {
		return nil, err
	}
	if p.out, p.childOut, err = os.Pipe(); err != nil {
		p.closeChildEnds()
		p.in.Close()
		return nil, err
	}
	if p.err, p.childErr, err = os.Pipe(); err != nil {
		p.closeChildEnds()
		p.in.Close()
		p.out.Close()
		return nil, err
	}
	return &p, nil
}

// closeChildEnds closes the child's ends in this process once the child
// has them (or failed to start), so that EOF on stdout means every process
// of the tree has closed it.
func (p *pipes) closeChildEnds() {
	for _, f := range []*os.File{p.childIn, p.childOut, p.childErr} {
		if f != nil {
			f.Close()
		}
	}
}

func (p *pipes) closeParentEnds() {
	p.in.Close()
	p.out.Close()
	p.err.Close()
}

// capped keeps the first max bytes of what it reads, and the last
// tool.PartialBytes of the rest (a stopped or failed call's
// partial_output is the end of what the tool wrote); it discards the
// bytes between.
type capped struct {
	max int64
	buf []byte
	// rest holds the end of what came after buf: up to twice
	// tool.PartialBytes, halved when full.
	rest []byte
}

func (c *capped) drain(r io.Reader) {
	chunk := make([]byte, 32<<10)
	// buf keeps a sequence's last bytes past max, so that its cut does
	// not split a character (tool.CutAt).
	room := c.max + utf8.UTFMax - 1
	for {
		n, err := r.Read(chunk)
		if n > 0 {
			keep := min(int64(n), room-int64(len(c.buf)))
			if keep > 0 {
				c.buf = append(c.buf, chunk[:keep]...)
			}
			if keep < int64(n) {
				c.keepEnd(chunk[keep:n])
			}
		}
		if err != nil {
			return
		}
	}
}

// keepEnd adds b to the end kept of what came after buf.
func (c *capped) keepEnd(b []byte) {
	if len(b) >= tool.PartialBytes {
		c.rest = append(c.rest[:0], b[len(b)-tool.PartialBytes:]...)
		return
	}
	if len(c.rest)+len(b) > 2*tool.PartialBytes {
		n := copy(c.rest, c.rest[len(c.rest)-tool.PartialBytes:])
		c.rest = c.rest[:n]
	}
	c.rest = append(c.rest, b...)
}

// result returns what was kept: the output's first max bytes, cut at a
// character's start, whether more was written, and the end of what was
// written when it is not all in the output.
func (c *capped) result() (out []byte, truncated bool, end []byte) {
	if int64(len(c.buf)) <= c.max && len(c.rest) == 0 {
		return c.buf, false, nil
	}
	out = c.buf[:tool.CutAt(c.buf, int(c.max))]
	all := append(c.buf[len(out):len(c.buf):len(c.buf)], c.rest...) // what came after out
	if len(all) >= tool.PartialBytes {
		return out, true, all[len(all)-tool.PartialBytes:]
	}
	// The end reaches back into out.
	end = make([]byte, 0, tool.PartialBytes)
	end = append(end, out[max(0, len(out)-(tool.PartialBytes-len(all))):]...)
	return out, true, append(end, all...)
}
