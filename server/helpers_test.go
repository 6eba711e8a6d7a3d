package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/doctest"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/script"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/sqlite"
	"github.com/timebox-run/timebox/tool"
)

// requests wraps a provider and keeps every request it received.
type requests struct {
	model.Provider
	mu   sync.Mutex
	reqs []model.Request
}

func (r *requests) Stream(ctx context.Context, req model.Request) (model.Stream, error) {
	r.mu.Lock()
	r.reqs = append(r.reqs, req)
	r.mu.Unlock()
	return r.Provider.Stream(ctx, req)
}

func (r *requests) last() model.Request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reqs[len(r.reqs)-1]
}

func scripted(t testing.TB, jsonl ...string) *requests {
	t.Helper()
	ls, err := script.Parse(strings.NewReader(strings.Join(jsonl, "\n")), "test")
	if err != nil {
		t.Fatal(err)
	}
	p, err := script.New(ls)
	if err != nil {
		t.Fatal(err)
	}
	return &requests{Provider: p}
}

func goTool(name string, enf budget.Enforcement, timeout time.Duration, fn tool.Handler) agent.Tool {
	return agent.Tool{
		Tool: tool.NewFunc(name, "a test tool", nil, fn),
		Budget: budget.ToolBudget{Timeout: budget.Duration{D: timeout, Source: budget.SourceTool, Knob: "tools[" + name + "].timeout"},
			Enforcement: enf, KillGrace: budget.Duration{D: 200 * time.Millisecond}},
	}
}

func newAgent(t testing.TB, p model.Provider, tools ...agent.Tool) *agent.Agent {
	t.Helper()
	a, err := agent.New(agent.Config{Name: "test", Instructions: "be brief",
		Models: []model.Endpoint{{Provider: p, ProviderName: "script", Model: "m"}}, Tools: tools})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// gate is a Go tool that runs until it is released or its context ends,
// reporting progress every `every` while it waits.
type gate struct {
	name      string
	every     time.Duration
	started   chan struct{}
	release   chan struct{}
	cancelled chan struct{}
	once      sync.Once
	relOnce   sync.Once
	cause     error
}

func newGate(name string) *gate {
	return &gate{name: name, started: make(chan struct{}, 100), release: make(chan struct{}), cancelled: make(chan struct{})}
}

func (g *gate) open() { g.relOnce.Do(func() { close(g.release) }) }

func (g *gate) tool() agent.Tool {
	return goTool(g.name, budget.Cooperative, time.Minute, func(ctx context.Context, _ json.RawMessage, p tool.Progress) (any, error) {
		g.started <- struct{}{}
		var tick <-chan time.Time
		if g.every > 0 {
			tk := time.NewTicker(g.every)
			defer tk.Stop()
			tick = tk.C
		}
		n := 0.0
		for {
			select {
			case <-g.release:
				return "released", nil
			case <-tick:
				n++
				p.Report(tool.Report{Progress: &n, Message: "waiting"})
			case <-ctx.Done():
				g.once.Do(func() {
					g.cause = context.Cause(ctx)
					close(g.cancelled)
				})
				return nil, ctx.Err()
			}
		}
	})
}

// env is a server on a loopback port.
type env struct {
	t      testing.TB
	srv    *server.Server
	st     store.Store
	url    string
	client *http.Client
	stop   func() error
}

func openStore(t testing.TB) store.Store {
	t.Helper()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "timebox.db"), sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func newEnv(t testing.TB, cfg server.Config) *env {
	t.Helper()
	if cfg.Store == nil {
		cfg.Store = openStore(t)
	}
	srv, err := server.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// Cleanups run last-registered first: stop the server (testenv.Serve's),
	// then close the store, then (newClient's) the client's idle
	// connections.
	client := newClient(t)
	t.Cleanup(func() { cfg.Store.Close() })
	url, stop := testenv.Serve(t, srv.Serve)
	return &env{t: t, srv: srv, st: cfg.Store, url: url, client: client, stop: stop}
}

// newClient returns a client whose connections are closed when the test
// ends, so that goleak sees none of its goroutines.
func newClient(t testing.TB) *http.Client {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func (e *env) do(method, path string, body any, hdr ...string) *http.Response {
	e.t.Helper()
	resp, err := e.doCtx(context.Background(), method, path, body, hdr...)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp
}

func (e *env) doCtx(ctx context.Context, method, path string, body any, hdr ...string) (*http.Response, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, e.url+path, rd)
	if err != nil {
		return nil, err
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	return e.client.Do(req)
}

// decode reads a JSON response with the wanted status.
func decode[T any](t testing.TB, resp *http.Response, status int) T {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, b)
	}
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("decoding %s: %v", b, err)
	}
	return v
}

type apiError struct {
	Error struct {
		Message string `json:"message"`
		Code    string `json:"code"`
	} `json:"error"`
}

// sseEvent is one event read from a stream.
type sseEvent struct {
	id   int64
	typ  string
	data string
}

type sseReader struct {
	r *bufio.Reader
}

func newSSE(body io.Reader) *sseReader { return &sseReader{r: bufio.NewReader(body)} }

// next returns the next event, skipping comments and retry fields; io.EOF
// when the stream ends.
func (s *sseReader) next() (sseEvent, error) {
	var ev sseEvent
	have := false
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			if err == io.EOF && line == "" && !have {
				return ev, io.EOF
			}
			return ev, fmt.Errorf("stream cut mid-event: %q: %w", line, err)
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if have {
				return ev, nil
			}
		case strings.HasPrefix(line, ":"), strings.HasPrefix(line, "retry:"):
		case strings.HasPrefix(line, "id: "):
			ev.id, err = strconv.ParseInt(line[4:], 10, 64)
			if err != nil {
				return ev, err
			}
			have = true
		case strings.HasPrefix(line, "event: "):
			ev.typ, have = line[7:], true
		case strings.HasPrefix(line, "data: "):
			ev.data, have = line[6:], true
		default:
			return ev, fmt.Errorf("unexpected line %q", line)
		}
	}
}

// until reads events until one of type typ, returning all read.
func (s *sseReader) until(t testing.TB, typ string) []sseEvent {
	t.Helper()
	var out []sseEvent
	for {
		ev, err := s.next()
		if err != nil {
			t.Fatalf("waiting for %s after %d events: %v", typ, len(out), err)
		}
		out = append(out, ev)
		if ev.typ == typ {
			return out
		}
	}
}

// all reads events until the stream ends.
func (s *sseReader) all(t testing.TB) []sseEvent {
	t.Helper()
	var out []sseEvent
	for {
		ev, err := s.next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ev)
	}
}

const sseAccept = "text/event-stream"

// stream starts a turn with an event stream.
func (e *env) stream(ctx context.Context, body any) (*http.Response, *sseReader) {
	e.t.Helper()
	resp, err := e.doCtx(ctx, "POST", "/v1/turns", body, "Accept", sseAccept, "Content-Type", "application/json")
	if err != nil {
		e.t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != sseAccept {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		e.t.Fatalf("POST /v1/turns: %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	return resp, newSSE(resp.Body)
}

// record reads a turn's record with its events as raw JSON.
type rawRecord struct {
	event.Turn
	Events []json.RawMessage `json:"events"`
}

func (e *env) record(id string) rawRecord {
	e.t.Helper()
	return decode[rawRecord](e.t, e.do("GET", "/v1/turns/"+id, nil), http.StatusOK)
}

func (e *env) storedStatus(id string) (budget.Status, budget.StopReason) {
	rec, err := e.st.Turn(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return rec.Status, rec.StopReason
}

func checkSeqs(t testing.TB, evs []sseEvent) {
	t.Helper()
	for i, ev := range evs {
		if ev.id != int64(i+1) {
			t.Fatalf("event %d has id %d (%s); want %d", i, ev.id, ev.typ, i+1)
		}
	}
}

func within(t testing.TB, d time.Duration, what string, ch <-chan struct{}) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(d):
		t.Fatalf("%s did not happen within %s", what, d)
	}
}

// errorCodes returns the error codes the handlers write, sorted, once
// each: those of writeError, and those of a failure whose cause is logged
// (Server.failed).
func errorCodes(t *testing.T) []string {
	t.Helper()
	codes, err := doctest.Calls(".", "writeError", 2)
	if err != nil {
		t.Fatal(err)
	}
	logged, err := doctest.Calls(".", "failed", 3)
	if err != nil {
		t.Fatal(err)
	}
	codes = append(codes, logged...)
	slices.Sort(codes)
	return slices.Compact(codes)
}
