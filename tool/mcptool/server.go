package mcptool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/tool"
)

// link is one connection to the server: one process of a stdio server, one
// session of an HTTP server. A restart makes a new link.
type link struct {
	s    *Server
	sess *mcp.ClientSession
	conn *wireConn // set when the transport connects
	proc *proc     // nil unless the server is a command
	// done is closed once the link is down for good and, for a stdio
	// server, its process group is gone.
	done chan struct{}

	// ignored is set when the link was killed because the server had not
	// answered a cancelled call in time (RestartOnIgnoredCancel).
	ignored     atomic.Bool
	ignoredOnce sync.Once

	mu  sync.Mutex
	why string // why the link ended, set before done is closed
	// version is the protocol version the server chose, once known.
	version atomic.Pointer[string]
}

// setWhy records why the link ended; the first reason given wins (a hang
// noticed by keepalive, before the exit its kill causes).
func (l *link) setWhy(why string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.why == "" {
		l.why = why
	}
}

func (l *link) reason() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.why
}

// protocolVersion is the MCP version timebox asks for: the newest one
// started with initialize. Asked for a newer one, the SDK (v1.8.0) first
// sends server/discover and waits for its answer; a server written before
// that method, which ignores requests it does not know, never answers, and
// the start hung until its timeout. Every server accepts initialize, and
// the stateless protocol brings timebox nothing it uses (one session per
// server; progress and cancellation are the same). A server may still
// choose an older version in its answer.
const protocolVersion = "2025-11-25"

// dial starts the server (or connects to it) and initializes a session.
// On failure nothing is left running.
func (s *Server) dial(ctx context.Context) (*link, error) {
	l := &link{s: s, done: make(chan struct{})}
	var t mcp.Transport
	switch {
	case s.cfg.dial != nil:
		var err error
		if t, err = s.cfg.dial(ctx); err != nil {
			return nil, err
		}
	case len(s.cfg.Command) > 0:
		p, err := startProc(ctx, s.cfg.Command, tool.Environ(s.cfg.Env, s.cfg.Withhold), s.cfg.Dir, s.cfg.User, s.cfg.Stderr)
		if err != nil {
			return nil, fmt.Errorf("starting MCP server %q (%s): %w", s.cfg.Name, strings.Join(s.cfg.Command, " "), err)
		}
		l.proc = p
		note := func(line string) {
			_, _ = p.stderr.Write([]byte(line + "\n"))
			s.log.Info("mcp server wrote a line on stdout that is not JSON-RPC; left out", "entry", s.cfg.Name, "line", line)
		}
		t = &mcp.IOTransport{Reader: newJSONLines(p.stdout, note), Writer: p.stdin, MaxLineLength: -1}
	default:
		ht := &headerTransport{headers: s.cfg.Headers, base: http.DefaultTransport, link: l}
		t = &mcp.StreamableClientTransport{Endpoint: s.cfg.URL, HTTPClient: &http.Client{Transport: ht}}
	}
	sess, err := s.client.Connect(ctx, &wireTransport{t: t, link: l}, &mcp.ClientSessionOptions{ProtocolVersion: protocolVersion})
	if err != nil {
		err = s.startError(ctx, l, err)
		l.stop(s.grace())
		return nil, err
	}
	l.sess = sess
	s.stats.starts.Add(1)
	s.linkWG.Add(1)
	go l.watch()
	if s.keepAlive > 0 {
		s.linkWG.Add(1)
		go l.keepalive(s.keepAlive)
	}
	return l, nil
}

// startError explains why a start failed: the start timeout, a process that
// exited before it was ready, or what the SDK said.
func (s *Server) startError(ctx context.Context, l *link, err error) error {
	what := fmt.Sprintf("MCP server %q", s.cfg.Name)
	if len(s.cfg.Command) > 0 {
		what += fmt.Sprintf(" (%s)", strings.Join(s.cfg.Command, " "))
	} else if s.cfg.URL != "" {
		what += fmt.Sprintf(" (%s)", s.cfg.URL)
	}
	timedOut := errors.Is(context.Cause(ctx), errStartTimeout)
	if l.proc != nil && !timedOut {
		// The SDK saw the connection end; the exit status says why.
		select {
		case <-l.proc.exited:
		case <-time.After(500 * time.Millisecond):
		}
		if l.conn != nil {
			if why := l.conn.messageProblem(); why != "" {
				return fmt.Errorf("%s %s before it was ready, so its connection was closed (MCP servers write only JSON-RPC messages on stdout; logs go to stderr)%s", what, why, l.proc.stderrText())
			}
		}
		if l.proc.hasExited() {
			return fmt.Errorf("%s exited before it was ready (%s)%s", what, l.proc.exitText(), l.proc.stderrText())
		}
	}
	if timedOut {
		msg := fmt.Sprintf("%s did not answer initialize and tools/list within %s, the start timeout", what, budget.FormatDuration(s.startTimeout))
		if len(s.cfg.Command) > 0 && s.cfg.Command[0] == "npx" {
			msg += "; npx may still be downloading the package: install it once (npm install) and name its binary in command"
		}
		if l.proc != nil {
			msg += l.proc.stderrText()
		}
		return errors.New(msg)
	}
	if ctx.Err() != nil {
		return fmt.Errorf("%s: start interrupted: %w", what, context.Cause(ctx))
	}
	msg := fmt.Sprintf("%s did not start: %v", what, err)
	if l.proc != nil {
		msg += l.proc.stderrText()
	}
	return errors.New(msg)
}

// watch waits for the session to end, then makes sure the process is gone
// and marks the server down, so that the next call restarts it.
func (l *link) watch() {
	defer l.s.linkWG.Done()
	err := l.sess.Wait()
	s := l.s
	if l.proc != nil {
		// The connection ended; the process usually has too, or is about
		// to. Give it the kill grace, then take its group down.
		select {
		case <-l.proc.exited:
		case <-time.After(s.grace()):
			l.proc.kill()
		}
		<-l.proc.exited
		if what := l.conn.messageProblem(); what != "" {
			l.setWhy(what + ", so its connection was closed")
		}
		if l.proc.killedByUs() {
			l.setWhy("closed its connection and was stopped")
		} else {
			l.setWhy(fmt.Sprintf("exited (%s)", l.proc.exitText()))
		}
	} else {
		why := "closed the connection"
		if err != nil {
			why = fmt.Sprintf("connection broke (%v)", err)
		}
		l.setWhy(why)
	}
	s.mu.Lock()
	if s.cur == l {
		s.cur = nil
		if !s.closed {
			s.failures++
			s.retryAt = time.Now().Add(backoff(s.failures))
			s.lastErr = errors.New(l.reason())
		}
	}
	closed := s.closed
	s.mu.Unlock()
	if !closed {
		s.log.Info("mcp server down; it will be restarted for the next call", "entry", s.cfg.Name, "why", l.reason())
	}
	close(l.done)
}

// keepalive pings the server. Two pings in a row left unanswered while no
// call is in flight mean the server is hung: its link is killed, and the
// next call starts it again. While a call runs, a ping that times out is
// not held against the server (DefaultKeepAlive says why); one the
// transport fails is. A ping is judged by the clock, not by its return:
// writing it may itself block on a server that stopped reading.
func (l *link) keepalive(every time.Duration) {
	defer l.s.linkWG.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	wait := every / 2
	misses := 0
	var pending chan error // the last ping, if it has not returned
	for {
		select {
		case <-l.done:
			return
		case <-l.s.closing:
			return
		case <-t.C:
		}
		if pending == nil {
			pending = make(chan error, 1)
			l.s.linkWG.Add(1)
			go func(res chan<- error) {
				defer l.s.linkWG.Done()
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				defer cancel()
				err := l.sess.Ping(ctx, nil)
				if err != nil && ctx.Err() != nil {
					err = context.DeadlineExceeded // unanswered, whatever the SDK made of it
				}
				res <- err
			}(pending)
		}
		timer := time.NewTimer(wait + wait/4)
		var err error
		select {
		case err = <-pending:
			pending = nil
		case <-timer.C:
			err = context.DeadlineExceeded
		case <-l.done:
			timer.Stop()
			return
		}
		timer.Stop()
		var we *jsonrpc.Error
		switch {
		case err == nil:
			misses = 0
			continue
		case errors.As(err, &we) && we.Code == jsonrpc.CodeMethodNotFound:
			return // the server does not do pings; its calls' timeouts still hold
		case errors.Is(err, mcp.ErrConnectionClosed):
			return // watch handles a closed connection
		case errors.Is(err, context.DeadlineExceeded) && l.s.inFlight.Load() > 0:
			misses = 0 // busy with a call: its own budgets judge it
			continue
		}
		misses++
		if misses < 2 {
			continue
		}
		l.setWhy(fmt.Sprintf("stopped answering (%d pings in a row went unanswered for %s each)", misses, wait))
		l.s.log.Info("mcp server hung; stopping it", "entry", l.s.cfg.Name)
		l.kill()
		return
	}
}

// kill takes the link down at once: a hung or dead server gets no polite
// stop.
func (l *link) kill() {
	if l.proc != nil {
		l.proc.kill()
	}
	if l.conn != nil {
		l.conn.forceClose()
	}
}

// stop shuts the link down politely: a stdio server's input is closed (the
// MCP way to ask it to exit), then its group gets SIGTERM and SIGKILL, each
// after grace; an HTTP session is closed, and cut after grace if it does not
// close. It returns when the link is down and its process group gone.
func (l *link) stop(grace time.Duration) {
	if l.proc != nil {
		l.proc.stop(grace)
	}
	if l.sess == nil {
		// The start failed before a session existed: the transport may be
		// connected with no one to close it.
		if l.conn != nil {
			l.conn.forceClose()
		}
		return
	}
	closed := make(chan struct{})
	go func() {
		// Close waits for calls in flight; cut the connection if a server
		// keeps one open.
		_ = l.sess.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(grace):
		l.kill()
		<-closed
	}
	<-l.done
}

// awaitCancel waits, once call a's context is done, for the server to
// answer the call after its cancellation, for at most grace from now. A
// server that has not (it went on with the call, or stopped reading) is
// restarted (restartIgnored), and awaitCancel returns, once its process
// tree is gone, the result that says so; nil when the server answered, or
// its link ended for another reason first.
func (s *Server) awaitCancel(l *link, a *active, remote string, grace time.Duration) *tool.Result {
	timer := time.NewTimer(grace)
	defer timer.Stop()
wait:
	for {
		select {
		case <-a.answered: // perhaps before its cancellation was written
			return nil
		case <-l.done:
			if !l.ignored.Load() {
				return nil
			}
			break wait // another call's restart took this one's server down too
		case <-s.closing:
			return nil
		case <-timer.C:
			l.restartIgnored(fmt.Sprintf("had not answered a cancelled call to %q %s after its cancellation", remote, budget.Round(grace)))
			break wait
		}
	}
	// The tree is SIGKILLed: it is gone in moments; bounded all the same,
	// as Run waits only so long (ReapMargin).
	reaped := time.NewTimer(tool.ReapMargin / 2)
	defer reaped.Stop()
	select {
	case <-l.done:
	case <-reaped.C:
	}
	note := fmt.Sprintf("[timebox] MCP server %q %s (mcp.on_ignored_cancel: restart): its process tree was killed and the next call starts a fresh server.",
		s.cfg.Name, l.reason())
	if t := strings.TrimSpace(l.proc.stderrTail()); t != "" {
		note = t + "\n" + note
	}
	return &tool.Result{StderrTail: note, ServerRestarted: true}
}

// restartIgnored takes the link down at once because its server went on
// with a cancelled call, and starts a fresh one for the next call, without
// the backoff of a failure. It happens once per link, whichever of its
// cancelled calls finds it first.
func (l *link) restartIgnored(why string) {
	l.ignoredOnce.Do(func() {
		s := l.s
		l.ignored.Store(true)
		l.setWhy(why)
		s.mu.Lock()
		if s.cur == l {
			s.cur = nil
		}
		s.mu.Unlock()
		s.stats.ignoredCancels.Add(1)
		tool.CountServerRestart()
		s.log.Info("mcp server went on with a cancelled call; restarting it", "entry", s.cfg.Name, "why", why)
		l.kill()
		s.startNow()
	})
}

// startNow starts the server again in the background, unless it is up,
// starting or closed: after a restart for an ignored cancel, the next
// call should find a fresh server ready rather than spend its own budget
// starting one.
func (s *Server) startNow() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.cur != nil || s.starting != nil {
		return
	}
	s.starting = make(chan struct{})
	go s.restart(s.starting)
}

// backoff is the wait before restart n+1 after n consecutive failures: the
// first restart is immediate, then 1s, 2s, 4s … up to 30s.
func backoff(failures int) time.Duration {
	if failures <= 1 {
		return 0
	}
	d := time.Second << min(failures-2, 5)
	return min(d, 30*time.Second)
}

// session returns the live link, restarting the server when it is down.
// A restart already under way is shared. A restart still in backoff is
// waited for when it is due before the call's deadline; otherwise the call
// fails at once with a tool error that says when the next attempt is.
func (s *Server) session(ctx context.Context, deadline time.Time) (*link, error) {
	for {
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			return nil, &tool.Error{Message: fmt.Sprintf("MCP server %q is closed", s.cfg.Name)}
		}
		if s.cur != nil {
			l := s.cur
			s.mu.Unlock()
			return l, nil
		}
		if s.starting == nil {
			if wait := time.Until(s.retryAt); wait > 0 {
				lastErr := s.lastErr
				s.mu.Unlock()
				if !deadline.IsZero() && time.Now().Add(wait).After(deadline) {
					return nil, &tool.Error{Message: fmt.Sprintf("MCP server %q is down (%v); it keeps failing, so timebox waits before restarting it: the next attempt is in %s, after this call's deadline",
						s.cfg.Name, lastErr, budget.Round(wait))}
				}
				timer := time.NewTimer(wait)
				select {
				case <-timer.C:
				case <-ctx.Done():
					timer.Stop()
					return nil, context.Cause(ctx)
				case <-s.closing:
					timer.Stop()
				}
				continue
			}
			s.starting = make(chan struct{})
			go s.restart(s.starting)
		}
		ch := s.starting
		s.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
		s.mu.Lock()
		l, err := s.cur, s.lastErr
		s.mu.Unlock()
		if l != nil {
			return l, nil
		}
		if err == nil { // closed while starting
			continue
		}
		return nil, &tool.Error{Message: fmt.Sprintf("MCP server %q could not be restarted: %v", s.cfg.Name, err)}
	}
}

// restart starts the server again, bounded by the start timeout and by
// Close, not by any one call: the calls waiting for it come and go.
func (s *Server) restart(done chan struct{}) {
	defer close(done)
	ctx, cancel := context.WithTimeoutCause(context.Background(), s.startTimeout, errStartTimeout)
	defer cancel()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-s.closing:
			cancel()
		case <-stop:
		}
	}()
	l, err := s.dial(ctx)
	s.mu.Lock()
	s.starting = nil
	closed := s.closed
	switch {
	case err != nil:
		s.failures++
		s.retryAt = time.Now().Add(backoff(s.failures))
		s.lastErr = err
	case !closed:
		s.cur, s.lastErr = l, nil
	}
	s.mu.Unlock()
	switch {
	case err != nil:
		s.log.Info("mcp server restart failed", "entry", s.cfg.Name, "error", err)
	case closed:
		l.stop(s.grace())
	default:
		s.log.Info("mcp server restarted", "entry", s.cfg.Name)
	}
}

// grace is the time a stopping server gets between the steps of its
// shutdown: the kill grace of the entry's budget.
func (s *Server) grace() time.Duration {
	if g := s.cfg.Budget.KillGrace.D; g > 0 {
		return g
	}
	return budget.Defaults().KillGrace.D
}

// callError explains a call that failed for a reason other than its
// context: a JSON-RPC error from the server, a server that died, hung or
// was shut down during the call, or a request the SDK could not make.
func (s *Server) callError(ctx context.Context, l *link, name string, err error) error {
	// The request did not reach the server (the SDK wraps the HTTP
	// client's error in its -32005 "rejected by transport", which is no
	// answer of the server's): the connection is taken down, and the next
	// call connects again.
	var ue *url.Error
	if l.proc == nil && errors.As(err, &ue) {
		why := fmt.Sprintf("could not be reached (%v)", ue.Err)
		if errors.Is(ue.Err, io.EOF) {
			why = "closed the connection"
		}
		l.setWhy(why)
		l.kill()
		// Retired before the next call looks for a link.
		t := time.NewTimer(time.Second)
		select {
		case <-l.done:
		case <-t.C:
		}
		t.Stop()
		return &tool.Error{Message: fmt.Sprintf("MCP server %q %s for the call to %q; timebox will connect again for the next call", s.cfg.Name, why, name)}
	}
	var we *jsonrpc.Error
	if errors.As(err, &we) {
		return &tool.Error{Message: fmt.Sprintf("MCP server %q refused the call to %q: %s (JSON-RPC error %d)", s.cfg.Name, name, we.Message, we.Code)}
	}
	if !l.conn.isBroken() && !errors.Is(err, mcp.ErrConnectionClosed) {
		return &tool.Error{Message: fmt.Sprintf("calling %q on MCP server %q failed: %v", name, s.cfg.Name, err)}
	}
	// The connection broke. Wait a moment for the watcher to learn why
	// (an exit status, a hang), but never past the call's own end.
	t := time.NewTimer(time.Second + s.grace())
	defer t.Stop()
	select {
	case <-l.done:
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-t.C:
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return &tool.Error{Message: fmt.Sprintf("MCP server %q was shut down during the call to %q (timebox is closing)", s.cfg.Name, name)}
	}
	why := l.reason()
	if l.ignored.Load() {
		te := &tool.Error{Message: fmt.Sprintf("MCP server %q was restarted during the call to %q: it %s (mcp.on_ignored_cancel: restart), so timebox killed its process tree, and this call with it. The next call starts a fresh server; this one may be tried again.",
			s.cfg.Name, name, why)}
		if l.proc != nil {
			te.StderrTail = l.proc.stderrTail()
		}
		return te
	}
	if why == "" {
		why = fmt.Sprintf("failed (%v)", err)
	}
	msg := fmt.Sprintf("MCP server %q %s during the call to %q; timebox will restart it for the next call", s.cfg.Name, why, name)
	te := &tool.Error{Message: msg}
	if l.proc != nil {
		te.StderrTail = l.proc.stderrTail()
	}
	return te
}

// Close stops the server: a stdio server's process group is gone when Close
// returns. Calls in flight fail. Close is idempotent and safe for
// concurrent use; it always returns nil, as a server that will not stop is
// killed.
func (s *Server) Close() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	close(s.closing)
	l, starting := s.cur, s.starting
	s.cur = nil
	s.mu.Unlock()
	if starting != nil {
		<-starting // the restart sees closing and stops what it started
	}
	if l != nil {
		l.stop(s.grace())
	}
	s.linkWG.Wait()
	return nil
}
