package server

import (
	"bytes"
	"context"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// A follower of a live turn is idle nearly all its life: it waits for the
// next event. A goroutine waiting costs its stack, and net/http's own
// connection state (its reader, writer, and the goroutine watching for the
// client going away) — about 30 KiB a follower in all, where ten thousand
// followers of one turn should cost little more than their sockets
// (issue 29; docs/decisions/parked-followers.md).
//
// So a follower's stream (GET /v1/turns/{id}/events of a turn running
// here, over HTTP/1.x) takes its connection from net/http (Hijack) and
// writes the response itself, delimited by closing the connection. When it
// has nothing to send it parks: it leaves a wake function with its
// subscription and a keep-alive timer, and its goroutine ends. The hub
// wakes it when a frame comes or its subscription closes, the timer when a
// keep-alive is due, Shutdown when the server closes its streams; a fresh
// goroutine then sends what there is and parks again. A parked follower
// learns that its client went away at its next write — an event or a
// keep-alive, Config.KeepAlive at most — rather than at once, as a
// goroutine reading the connection would.
//
// The stream that started a turn (POST /v1/turns asking for a stream)
// keeps its goroutine: the turn is cancelled the moment that client goes
// away, unless it was detached.

// parked is a follower's stream that parks while idle.
type parked struct {
	s  *Server
	st *streamState
	lt *liveTurn
	sb *sub // its subscription when parked

	state atomic.Int32 // running or asleep
	timer *time.Timer  // the keep-alive's
	armed atomic.Bool  // timer is set to fire
	cut   atomic.Bool  // its connection was closed under it (streams.wait)
}

const (
	running int32 = iota // a goroutine drives the stream
	asleep               // no goroutine does: one of the wakers starts one
)

// hijack takes w's connection for st and writes the response's head (w's
// header, 200) and retry, or returns nil if w's connection cannot be taken
// (HTTP/2, a test's recorder); the stream then keeps its goroutine.
func (s *Server) hijack(w http.ResponseWriter, st *streamState, deadline time.Duration) *parked {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return nil
	}
	// The connection's buffered reader is dropped: the client sends nothing
	// more that the stream reads (Connection: close).
	h := w.Header()
	h.Set("Date", time.Now().UTC().Format(http.TimeFormat))
	h.Set("Connection", "close")
	var head bytes.Buffer
	head.WriteString("HTTP/1.1 200 OK\r\n")
	h.Write(&head)
	head.WriteString("\r\n")
	st.x = &sse{conn: conn, deadline: deadline}
	if sc, ok := conn.(syscall.Conn); ok {
		st.x.raw, _ = sc.SyscallConn()
	}
	st.x.write(head.Bytes(), sseRetry)
	// The request's context ends when the handler returns; the stream
	// goes on. Its client going away shows as a failed write.
	st.ctx = context.Background()
	p := &parked{s: s, st: st}
	p.timer = time.AfterFunc(time.Hour, func() {
		p.armed.Store(false)
		p.wake()
	})
	p.timer.Stop()
	s.streams.add(p)
	return p
}

// follow follows lt until its stream ends or parks; the stream's
// connection is closed when it ends.
func (p *parked) follow(lt *liveTurn, sb *sub) streamEnd {
	p.lt = lt
	end := p.st.follow(lt, sb)
	if end != endParked {
		p.close()
	}
	return end
}

// idle is what a stream that parks does when it has no frame to send: it
// ends if the server is closing its streams, sends a keep-alive if one is
// due, then parks. stop is false if something came meanwhile, and the
// stream goes on in this goroutine.
func (p *parked) idle(lt *liveTurn, sb *sub) (end streamEnd, stop bool) {
	st := p.st
	if p.cut.Load() {
		lt.hub.unsubscribe(sb)
		return endClientGone, true
	}
	select {
	case <-p.s.closing:
		lt.hub.unsubscribe(sb)
		return st.shutdown(lt), true
	default:
	}
	if time.Since(st.x.wrote) >= p.s.cfg.KeepAlive {
		st.x.comment("keep-alive")
		if st.x.err != nil {
			lt.hub.unsubscribe(sb)
			return endClientGone, true
		}
	}
	p.sb = sb
	due := p.s.cfg.KeepAlive - time.Since(st.x.wrote)
	// The next writer to drive the stream is whoever wakes it.
	w := st.x.writer
	st.x.writer = nil
	// From here a waker may start a goroutine that drives the stream: this
	// one touches nothing but what is safe to share.
	p.state.Store(asleep)
	if !p.armed.Load() {
		// An armed timer fires at the latest when a keep-alive is due
		// (writes only put it off): the stream then parks again until it
		// is. A fan-out does not reset ten thousand timers.
		p.armed.Store(true)
		p.timer.Reset(due)
	}
	if sb.park(p) && !p.s.isClosing() {
		return endParked, true
	}
	// Something came: go on here, unless a waker has started a goroutine
	// that does.
	if p.state.CompareAndSwap(asleep, running) {
		st.x.writer = w
		return 0, false
	}
	return endParked, true
}

// wake has a writer drive the stream (writers.go), if it is asleep. It is
// called by the keep-alive timer and by Shutdown, and for a fan-out by the
// hub (writers.wake): it never blocks.
func (p *parked) wake() {
	p.s.writers.wake([]*parked{p})
}

// close ends the stream: its connection is closed, which ends the
// response.
func (p *parked) close() {
	p.timer.Stop()
	if p.st.keepAlive != nil {
		p.st.keepAlive.Stop()
	}
	p.st.x.conn.Close()
	p.s.streams.remove(p)
}

// streams are the streams that took their connections: http.Server's
// Shutdown does not wait for them, Serve does.
type streams struct {
	mu  sync.Mutex
	set map[*parked]struct{}
	wg  sync.WaitGroup
}

func (ss *streams) add(p *parked) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.set == nil {
		ss.set = map[*parked]struct{}{}
	}
	ss.set[p] = struct{}{}
	ss.wg.Add(1)
}

func (ss *streams) remove(p *parked) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if _, ok := ss.set[p]; ok {
		delete(ss.set, p)
		ss.wg.Done()
	}
}

// wakeAll wakes every parked stream; with closeConns, it closes their
// connections first, so that they end at their next write.
func (ss *streams) wakeAll(closeConns bool) {
	ss.mu.Lock()
	all := make([]*parked, 0, len(ss.set))
	for p := range ss.set {
		all = append(all, p)
	}
	ss.mu.Unlock()
	for _, p := range all {
		if closeConns {
			p.cut.Store(true)
			p.st.x.conn.Close()
		}
		p.wake()
	}
}

// wait waits until every stream has ended, at most d; then it closes
// their connections and waits for them to end.
func (ss *streams) wait(d time.Duration) {
	done := make(chan struct{})
	go func() {
		ss.wg.Wait()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	ss.wakeAll(true)
	<-done
}

func (s *Server) isClosing() bool {
	select {
	case <-s.closing:
		return true
	default:
		return false
	}
}
