package script

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/model"
)

// Recording writes what live providers replied, with timings, as script
// lines (`timebox run --record FILE`), so that an incident seen with a real
// model can be replayed offline with the script provider. Each model call
// becomes one line, in the order the calls ended. It is safe for concurrent
// use.
type Recording struct {
	mu  sync.Mutex
	enc *json.Encoder
	err error
}

// NewRecording returns a recording that writes to w.
func NewRecording(w io.Writer) *Recording {
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return &Recording{enc: enc}
}

// Err returns the first write error, if any.
func (r *Recording) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

func (r *Recording) write(l Line) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err == nil {
		r.err = r.enc.Encode(l)
	}
}

// Wrap returns p with every reply recorded.
func (r *Recording) Wrap(p model.Provider) model.Provider { return &recorded{p: p, r: r} }

type recorded struct {
	p model.Provider
	r *Recording
}

// Stream opens p's stream, recording a failure to open it as a script line.
func (rp *recorded) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	start := time.Now()
	s, err := rp.p.Stream(ctx, req)
	if err != nil {
		l := failureLine(err, time.Since(start), 0)
		l.Compaction = req.Compaction
		rp.r.write(l)
		return nil, err
	}
	return &recordedStream{Stream: s, r: rp.r, start: start, compaction: req.Compaction}, nil
}

type recordedStream struct {
	model.Stream
	r *Recording
	// compaction marks the line of a compaction call, so that a replay
	// answers compaction calls with it and the turn's calls without.
	compaction bool
	start      time.Time
	chunks     []string
	at         []time.Time
	once       sync.Once
}

// Recv returns the next chunk, noting its text and time, and records the
// reply, or its failure, as a script line when the stream ends.
func (s *recordedStream) Recv() (model.Chunk, error) {
	c, err := s.Stream.Recv()
	switch {
	case err == nil:
		s.chunks = append(s.chunks, c.Text)
		s.at = append(s.at, time.Now())
	case err == io.EOF:
		s.once.Do(func() { s.r.write(s.line(s.Stream.Response())) })
	default:
		s.once.Do(func() {
			l := failureLine(err, time.Since(s.start), len(s.chunks))
			if l.StallAfter != nil { // keep what streamed before the silence
				l = s.line(model.Response{})
				n := len(s.chunks)
				l.StallAfter = &n
			}
			l.Compaction = s.compaction
			s.r.write(l)
		})
	}
	return c, err
}

// Close records a stream that was abandoned before its end as one that
// stalled there.
func (s *recordedStream) Close() error {
	s.once.Do(func() {
		l := s.line(model.Response{})
		n := len(s.chunks)
		l.StallAfter = &n
		s.r.write(l)
	})
	return s.Stream.Close()
}

func (s *recordedStream) line(resp model.Response) Line {
	l := Line{Chunks: s.chunks, Compaction: s.compaction}
	if len(s.at) > 0 {
		l.FirstChunkDelay = Duration(s.at[0].Sub(s.start).Round(time.Millisecond))
	}
	if len(s.at) > 1 {
		l.ChunkDelay = Duration((s.at[len(s.at)-1].Sub(s.at[0]) / time.Duration(len(s.at)-1)).Round(time.Millisecond))
	}
	// The script provider sends tool calls as one chunk of their own.
	if len(resp.ToolCalls) > 0 && len(l.Chunks) > 0 && l.Chunks[len(l.Chunks)-1] == "" {
		l.Chunks = l.Chunks[:len(l.Chunks)-1]
	}
	for _, c := range resp.ToolCalls {
		args := json.RawMessage(c.Arguments)
		if !json.Valid(args) {
			args, _ = json.Marshal(c.Arguments)
		}
		l.ToolCalls = append(l.ToolCalls, Call{Name: c.Name, Arguments: args})
	}
	return l
}

// failureLine records a failed call: a provider error as an error line, a
// timeout or cancellation as a stall after the chunks seen.
func failureLine(err error, elapsed time.Duration, chunks int) Line {
	var me *model.Error
	if errors.As(err, &me) && me.Status != 0 {
		return Line{FirstChunkDelay: Duration(elapsed.Round(time.Millisecond)),
			Error: &Failure{Status: me.Status, Message: me.Message, RetryAfter: Duration(me.RetryAfter)}}
	}
	if _, ok := budget.AsTimeout(err); ok || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return Line{StallAfter: &chunks}
	}
	return Line{Error: &Failure{Status: 502, Message: err.Error()}}
}
