package server

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/longjson"
)

// streamEnd is why an event stream ended.
type streamEnd int

const (
	endFinished   streamEnd = iota // the turn ended and all its events were sent
	endClientGone                  // the client went away, or stopped reading
	endShutdown                    // the server is shutting down
	endParked                      // the stream is idle, with no goroutine (park.go)
)

// replayPage is how many stored events a replay reads at a time.
const replayPage = 500

// sse writes Server-Sent Events. Each write has a deadline, so a client
// that stopped reading (a dead peer, a full TCP window) ends its stream
// instead of holding a goroutine forever.
type sse struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	// conn, once set, is the stream's own connection (park.go): w and rc
	// are nil then.
	conn     net.Conn
	deadline time.Duration
	wrote    time.Time // the last write
	until    time.Time // conn's write deadline
	hdr      []byte
	bufs     [][]byte // event's writev, reused
	err      error
	// raw is conn's file descriptor, for writes that must not wait
	// (nowWriter); nil when conn has none (TLS).
	raw syscall.RawConn
	// writer, while set, is the pool's goroutine that drives the stream
	// (writers.go): a write that would wait, and anything else that may,
	// takes the goroutine out of the pool first (own).
	writer *writer
}

var sseEnd = []byte("\n\n")

// write writes bs, one after the other, at once.
func (x *sse) write(bs ...[]byte) {
	if x.err != nil {
		return
	}
	x.wrote = time.Now()
	if x.conn != nil {
		// The deadline is moved only once half of it has passed: a write
		// still fails within deadline, and a fan-out to ten thousand
		// followers does not reset ten thousand of the poller's timers.
		if x.wrote.Add(x.deadline / 2).After(x.until) {
			x.until = x.wrote.Add(x.deadline)
			_ = x.conn.SetWriteDeadline(x.until)
		}
		if x.writer != nil {
			n, whole := x.writer.now.write(x.raw, bs)
			if whole {
				return
			}
			bs = consume(bs, n)
			x.own() // the rest may wait for the client
		}
		v := net.Buffers(bs) // one writev
		_, x.err = v.WriteTo(x.conn)
		return
	}
	_ = x.rc.SetWriteDeadline(x.wrote.Add(x.deadline))
	for _, b := range bs {
		if _, x.err = x.w.Write(b); x.err != nil {
			return
		}
	}
	x.err = x.rc.Flush()
}

// event writes one event: `id:` is its seq, `event:` its type, `data:` its
// flat JSON (one line: JSON escapes newlines). data is written as it is,
// never copied: a long text — a long reply's turn_finished — is escaped a
// piece at a time as the client takes it, by this stream alone, and is not
// held again for each follower, nor at all for a turn no one follows.
func (x *sse) event(seq int64, typ event.Type, data longjson.Doc) {
	h := append(x.hdr[:0], "id: "...)
	h = strconv.AppendInt(h, seq, 10)
	h = append(h, "\nevent: "...)
	h = append(h, typ...)
	h = append(h, "\ndata: "...)
	x.hdr = h
	if b, whole := data.Raw(); whole {
		bs := append(x.bufs[:0], h, b, sseEnd)
		x.write(bs...)
		clear(bs) // writev consumed the headers; let the data go
		x.bufs = bs[:0]
		return
	}
	// Megabytes: more than a socket takes without waiting.
	x.own()
	x.write(h)
	_, _ = data.WriteTo(sseWriter{x})
	x.write(sseEnd)
}

// sseWriter writes a long event's pieces to its stream, each under the
// stream's write deadline: a client that takes them goes on; one that
// stops taking them ends its stream.
type sseWriter struct{ x *sse }

// Write writes p to the stream under its write deadline, and returns the
// stream's error once it has one.
func (w sseWriter) Write(p []byte) (int, error) {
	w.x.write(p)
	if w.x.err != nil {
		return 0, w.x.err
	}
	return len(p), nil
}

// own takes the stream's goroutine out of the writers' pool, if it is in
// it, before something that may wait: it is the stream's own from here.
func (x *sse) own() {
	if w := x.writer; w != nil {
		x.writer = nil
		w.leave()
	}
}

// consume drops the first n bytes of bs.
func consume(bs [][]byte, n int) [][]byte {
	for len(bs) > 0 && n >= len(bs[0]) {
		n -= len(bs[0])
		bs = bs[1:]
	}
	if n > 0 {
		bs[0] = bs[0][n:]
	}
	return bs
}

func (x *sse) comment(text string) { x.write([]byte(": " + text + "\n\n")) }

// sseHeaders sets the headers of an event stream.
func sseHeaders(h http.Header) {
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
}

// stream writes the events of turn id after seq `after` as SSE: first the
// stored ones, then live ones as they happen, until the turn ends (once
// its record is stored), the client goes away, or the server shuts down.
// lt is the turn when it runs in this server, else nil. sb, when set, is a
// subscription taken before the turn emitted anything.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, lt *liveTurn, after int64, sb *sub) streamEnd {
	sseHeaders(w.Header())
	st := &streamState{s: s, ctx: r.Context(), id: r.PathValue("id"), last: after}
	deadline := max(2*s.cfg.KeepAlive, 10*time.Second)
	if lt != nil && sb == nil && r.Method == http.MethodGet {
		// A follower of a turn running here: its stream parks while idle,
		// with a keep-alive timer of its own (a ticker only while it
		// pauses, in pause).
		st.p = s.hijack(w, st, deadline)
	}
	if st.p == nil {
		st.keepAlive = time.NewTicker(s.cfg.KeepAlive)
		defer st.keepAlive.Stop()
		w.WriteHeader(http.StatusOK)
		st.x = &sse{w: w, rc: http.NewResponseController(w), deadline: deadline}
		// retry: how soon an EventSource reconnects. Writing it also sends
		// the headers (Timebox-Turn-Id) before the first event.
		st.x.write(sseRetry)
	}
	if lt == nil {
		return st.poll()
	}
	st.id = lt.id
	if st.p != nil {
		return st.p.follow(lt, sb)
	}
	return st.follow(lt, sb)
}

var sseRetry = []byte("retry: 2000\n\n")

type streamState struct {
	s         *Server
	x         *sse
	ctx       context.Context
	id        string
	last      int64 // seq of the last event sent
	finished  bool  // turn_finished was sent
	keepAlive *time.Ticker
	p         *parked // set for a stream that parks while idle
}

// send writes one event unless it was already sent.
func (st *streamState) send(seq int64, typ event.Type, at time.Time, data longjson.Doc, live bool) {
	if seq <= st.last || st.x.err != nil {
		return
	}
	st.x.event(seq, typ, data)
	if st.x.err != nil {
		return
	}
	st.last = seq
	st.finished = st.finished || typ == event.TypeTurnFinished
	st.s.m.sent(at, live)
}

// replayAll is replay's bound for "every stored event".
const replayAll = -1

// replay sends the stored events after st.last, up to seq upto (or all,
// with replayAll).
func (st *streamState) replay(upto int64) error {
	st.x.own() // reading the store may wait
	for {
		evs, err := st.s.cfg.Store.Events(st.ctx, st.id, st.last, replayPage)
		if err != nil {
			return err
		}
		for _, e := range evs {
			if upto != replayAll && e.Seq > upto {
				return nil
			}
			data, err := frameData(e) // a long answer escaped as it is written
			if err != nil {
				return err
			}
			st.send(e.Seq, e.Type, e.At, data, false)
			if st.x.err != nil {
				return st.x.err
			}
		}
		if len(evs) < replayPage {
			return nil
		}
	}
}

// replayStored is replay, waiting out a store that cannot be read (its
// database restarting): a follower keeps its place and goes on once the
// store answers, rather than end its stream without turn_finished. It
// fails only when the client goes away or the server shuts down.
func (st *streamState) replayStored(upto int64) error {
	wait := 100 * time.Millisecond
	logged := false
	for {
		err := st.replay(upto)
		if err == nil || st.x.err != nil {
			return err
		}
		if !logged {
			logged = true
			st.s.log.Warn("a follower cannot read the store; it keeps its place and tries again", "turn_id", st.id, "after", st.last, "err", err)
		}
		if err := st.pause(wait); err != nil {
			return err
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// pause waits d, keeping the client's connection alive, unless the client
// goes away or the server shuts down first.
func (st *streamState) pause(d time.Duration) error {
	st.x.own()
	t := time.NewTimer(d)
	defer t.Stop()
	if st.keepAlive == nil {
		st.keepAlive = time.NewTicker(st.s.cfg.KeepAlive)
	}
	for {
		select {
		case <-t.C:
			return nil
		case <-st.keepAlive.C:
			st.x.comment("keep-alive")
			if st.x.err != nil {
				return st.x.err
			}
		case <-st.ctx.Done():
			return st.ctx.Err()
		case <-st.s.closing:
			return errShuttingDown
		}
	}
}

var errShuttingDown = errors.New("the server is shutting down")

// closed is how a stream ends that replayStored or pause gave up on.
func (st *streamState) closed(err error) streamEnd {
	if errors.Is(err, errShuttingDown) {
		return st.shutdown(nil)
	}
	return st.end(endClientGone)
}

func (st *streamState) end(reason streamEnd) streamEnd {
	if st.x.err != nil {
		return endClientGone
	}
	return reason
}

// follow streams a turn running in this server.
func (st *streamState) follow(lt *liveTurn, sb *sub) streamEnd {
	var (
		stored  = st.last
		pending []frame
	)
	for {
		if sb == nil {
			sb, stored, pending = lt.hub.subscribe()
		}
		// What the follower missed: the stored events, then those the
		// store does not have yet. Nothing for a subscription taken before
		// the turn emitted (POST /v1/turns).
		if stored > st.last {
			if err := st.replayStored(stored); err != nil {
				if sb != nil {
					lt.hub.unsubscribe(sb)
				}
				return st.end(endClientGone)
			}
		}
		for _, f := range pending {
			st.send(f.seq, f.typ, f.at, f.data, false)
		}
		pending = nil
		if sb == nil {
			// The turn has ended: the store has the rest once it is
			// stored; it was sent if it was pending.
			if !st.finished {
				if err := st.replayStored(replayAll); err != nil {
					return st.end(endClientGone)
				}
			}
			return st.end(endFinished)
		}
		if st.finished {
			lt.hub.unsubscribe(sb)
			st.waitStored(lt)
			return st.end(endFinished)
		}
		for open := true; open; {
			fs, ok, end, stop := st.next(lt, sb)
			if stop {
				return end
			}
			for _, f := range fs {
				st.send(f.seq, f.typ, f.at, f.data, true)
				if st.finished {
					lt.hub.unsubscribe(sb)
					st.waitStored(lt)
					return st.end(endFinished)
				}
				if st.x.err != nil {
					lt.hub.unsubscribe(sb)
					return endClientGone
				}
			}
			sb.recycle(fs)
			// Once sb is closed — cut loose for falling behind (lagged),
			// or the turn ended before we saw turn_finished — subscribing
			// again catches up from the store, then goes on live.
			open = ok
		}
		sb = nil
	}
}

// next waits for sb's next frames; open is false once sb is closed (and
// these are its last). Meanwhile it keeps the client's connection alive;
// stop says the stream ended (end says why, sb is unsubscribed) or parked.
func (st *streamState) next(lt *liveTurn, sb *sub) (fs []*frame, open bool, end streamEnd, stop bool) {
	for {
		if fs, open = sb.take(); len(fs) > 0 || !open {
			return fs, open, 0, false
		}
		if st.p != nil {
			if end, stop = st.p.idle(lt, sb); stop {
				return nil, false, end, true
			}
			continue // something came as it parked
		}
		select {
		case <-sb.ready:
			continue
		case <-st.keepAlive.C:
			st.x.comment("keep-alive")
		case <-st.ctx.Done():
			lt.hub.unsubscribe(sb)
			return nil, false, endClientGone, true
		case <-st.s.closing:
			lt.hub.unsubscribe(sb)
			return nil, false, st.shutdown(lt), true
		}
		if st.x.err != nil {
			lt.hub.unsubscribe(sb)
			return nil, false, endClientGone, true
		}
	}
}

// shutdown ends a stream because the server is closing its streams.
// Shutdown closes them only once the running turns have ended and stored
// their records, but the follower may not have sent the last frames yet
// (select picks at random between a ready frame and the closing server):
// whatever the stream has not sent, turn_finished included, is in the
// store, and it is sent before the stream ends. Only a turn that did not
// end (a Runner that ignored its cancellation) ends its stream without
// turn_finished; the client resumes it from the store after a restart.
func (st *streamState) shutdown(lt *liveTurn) streamEnd {
	if lt != nil {
		select {
		case <-lt.done:
		default:
			return st.end(endShutdown)
		}
	}
	if err := st.replay(replayAll); err != nil {
		return st.end(endClientGone)
	}
	if st.finished {
		return st.end(endFinished)
	}
	return st.end(endShutdown)
}

// waitStored waits, briefly, until the turn's record is stored, so that a
// client whose stream ended can read the final record at once.
func (st *streamState) waitStored(lt *liveTurn) {
	select {
	case <-lt.done:
		return // stored already: the stream stays in the writers' pool
	default:
	}
	st.x.own()
	t := time.NewTimer(5 * time.Second)
	defer t.Stop()
	select {
	case <-lt.done:
	case <-t.C:
	case <-st.ctx.Done():
	}
}

// poll streams a turn that does not run in this server: an ended one, or
// one another process (sharing the store) runs, whose new events it reads
// whenever the store says there may be some (store.Store.Watch: at once
// with PostgreSQL's notifications, every 250ms with SQLite).
func (st *streamState) poll() streamEnd {
	changed, unwatch := st.s.cfg.Store.Watch(st.id)
	defer unwatch()
	checked := st.last // st.last when the turn's status was last read (or at the start)
	for {
		if err := st.replayStored(replayAll); err != nil {
			return st.closed(err)
		}
		if st.finished {
			return endFinished
		}
		// A turn ends with turn_finished; its status is read only when no
		// event came, for a turn stored without one, so that a busy
		// turn's followers read its events and nothing else.
		if st.last == checked {
			rec, err := st.s.cfg.Store.Turn(st.ctx, st.id)
			if err != nil {
				// The store is away: read again in a moment.
				if err := st.pause(time.Second); err != nil {
					return st.closed(err)
				}
				continue
			}
			if rec.Status != budget.StatusRunning {
				st.replayStored(replayAll) // what came between the two reads
				return st.end(endFinished)
			}
		}
		checked = st.last
		select {
		case <-changed:
		case <-st.keepAlive.C:
			st.x.comment("keep-alive")
		case <-st.ctx.Done():
			return endClientGone
		case <-st.s.closing:
			return st.shutdown(nil)
		}
		if st.x.err != nil {
			return endClientGone
		}
	}
}
