package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"

	"go.uber.org/goleak"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/tool"
)

func TestMain(m *testing.M) {
	if helperMain() {
		return
	}
	goleak.VerifyTestMain(m, goleak.Cleanup(func(int) { testenv.StopPostgres() }))
}

// waitThenAnswer is a script: call the gate tool, then answer.
var waitThenAnswer = []string{`{"chunks": ["Let me ", "wait."], "tool_calls": [{"name": "wait", "arguments": {}}]}`, `{"text": "done waiting"}`}

func TestStreamOfAWholeTurn(t *testing.T) {
	g := newGate("wait")
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, waitThenAnswer...), g.tool())})
	resp, sse := e.stream(t.Context(), map[string]any{"input": "hello"})
	defer resp.Body.Close()
	// The turn is named before its first event: the headers are here
	// while the turn is stuck in its tool.
	id := resp.Header.Get(server.HeaderTurnID)
	if !strings.HasPrefix(id, "t_") || !strings.HasPrefix(resp.Header.Get(server.HeaderSessionID), "s_") {
		t.Fatalf("headers %v", resp.Header)
	}
	<-g.started
	if st, _ := e.storedStatus(id); st != budget.StatusRunning {
		t.Fatalf("status %s while the tool runs", st)
	}
	g.open()
	evs := sse.all(t)
	checkSeqs(t, evs)
	if evs[0].typ != "turn_started" || evs[len(evs)-1].typ != "turn_finished" {
		t.Fatalf("first %s, last %s", evs[0].typ, evs[len(evs)-1].typ)
	}
	// The stream is the record's event log, byte for byte, and the record
	// is stored by the time the stream ends.
	rec := e.record(id)
	type summary struct {
		Status    budget.Status
		Answer    string
		ToolCalls int
	}
	if diff := cmp.Diff(summary{budget.StatusCompleted, "done waiting", 1}, summary{rec.Status, rec.Answer, len(rec.ToolCalls)}); diff != "" {
		t.Fatalf("record (-want +got):\n%s", diff)
	}
	if len(rec.Events) != len(evs) {
		t.Fatalf("record has %d events, the stream %d", len(rec.Events), len(evs))
	}
	for i, ev := range evs {
		if string(rec.Events[i]) != ev.data {
			t.Fatalf("event %d:\nstream %s\nrecord %s", i, ev.data, rec.Events[i])
		}
		var h struct {
			Seq  int64  `json:"seq"`
			Type string `json:"type"`
		}
		json.Unmarshal([]byte(ev.data), &h)
		if h.Seq != ev.id || h.Type != ev.typ {
			t.Fatalf("event %d: id %d event %s, data says %d %s", i, ev.id, ev.typ, h.Seq, h.Type)
		}
	}
}

func TestJSONResponse(t *testing.T) {
	g := newGate("wait")
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, waitThenAnswer...), g.tool())})
	resp := e.do("POST", "/v1/turns", map[string]any{"input": "hello", "session_id": "s1"})
	id := resp.Header.Get(server.HeaderTurnID)
	if id == "" || resp.Header.Get(server.HeaderSessionID) != "s1" || resp.Header.Get("Location") != "/v1/turns/"+id {
		t.Fatalf("headers %v", resp.Header)
	}
	<-g.started // the headers came while the turn runs
	g.open()
	rec := decode[rawRecord](t, resp, http.StatusOK)
	if rec.TurnID != id || rec.Status != budget.StatusCompleted || rec.SessionID != "s1" || len(rec.Events) < 5 {
		t.Fatalf("record %+v with %d events", rec.Turn, len(rec.Events))
	}
}

func TestDetachedJSONIsAcceptedAtOnce(t *testing.T) {
	g := newGate("wait")
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, waitThenAnswer...), g.tool())})
	acc := decode[server.TurnAccepted](t, e.do("POST", "/v1/turns", map[string]any{"input": "go", "detach": true}), http.StatusAccepted)
	if acc.Status != budget.StatusRunning || acc.Events != "/v1/turns/"+acc.TurnID+"/events" {
		t.Fatalf("%+v", acc)
	}
	<-g.started
	g.open()
	resp := e.do("GET", acc.Events, nil)
	defer resp.Body.Close()
	evs := newSSE(resp.Body).all(t)
	if evs[len(evs)-1].typ != "turn_finished" {
		t.Fatalf("last %s", evs[len(evs)-1].typ)
	}
	if st, _ := e.storedStatus(acc.TurnID); st != budget.StatusCompleted {
		t.Fatalf("status %s", st)
	}
}

func TestClientGoneCancelsTheTurn(t *testing.T) {
	g := newGate("wait")
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, waitThenAnswer...), g.tool())})
	ctx, drop := context.WithCancel(t.Context())
	resp, sse := e.stream(ctx, map[string]any{"input": "hello"})
	id := resp.Header.Get(server.HeaderTurnID)
	sse.until(t, "tool_started")
	dropped := time.Now()
	drop() // the client goes away mid-turn
	resp.Body.Close()

	within(t, time.Second, "the tool's context being cancelled", g.cancelled)
	if ce, ok := budget.AsCancel(g.cause); !ok || ce.Reason != budget.ClientGone {
		t.Fatalf("the tool's context ended for %v", g.cause)
	}
	wait.For(t, time.Second-time.Since(dropped), "the record saying client_gone", func() bool {
		st, r := e.storedStatus(id)
		return st == budget.StatusCancelled && r == budget.ClientGone
	})
	rec := e.record(id)
	if len(rec.ToolCalls) != 1 || rec.ToolCalls[0].Outcome != event.OutcomeCancelled || !strings.Contains(rec.Message, "the client went away") {
		t.Fatalf("record %+v", rec.Turn)
	}
	var last event.Event
	json.Unmarshal(rec.Events[len(rec.Events)-1], &last)
	if tf, ok := last.Data.(*event.TurnFinished); !ok || tf.StopReason != budget.ClientGone {
		t.Fatalf("stored log ends with %+v", last)
	}
}

func TestClientGoneFromAJSONRequest(t *testing.T) {
	g := newGate("wait")
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, waitThenAnswer...), g.tool())})
	ctx, drop := context.WithCancel(t.Context())
	resp, err := e.doCtx(ctx, "POST", "/v1/turns", map[string]any{"input": "hello"})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.Header.Get(server.HeaderTurnID)
	<-g.started
	drop()
	resp.Body.Close()
	within(t, time.Second, "the tool's context being cancelled", g.cancelled)
	wait.For(t, time.Second, "client_gone", func() bool { _, r := e.storedStatus(id); return r == budget.ClientGone })
}

func TestDetachKeepsTheTurnRunning(t *testing.T) {
	g := newGate("wait")
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, waitThenAnswer...), g.tool())})
	ctx, drop := context.WithCancel(t.Context())
	resp, sse := e.stream(ctx, map[string]any{"input": "hello", "detach": true})
	id := resp.Header.Get(server.HeaderTurnID)
	sse.until(t, "tool_started")
	drop()
	resp.Body.Close()
	select {
	case <-g.cancelled:
		t.Fatal("a detached turn was cancelled when its client left")
	case <-time.After(300 * time.Millisecond):
	}
	if st, _ := e.storedStatus(id); st != budget.StatusRunning {
		t.Fatalf("status %s", st)
	}
	// Follow it again and let it finish.
	fresp := e.do("GET", "/v1/turns/"+id+"/events", nil)
	defer fresp.Body.Close()
	g.open()
	evs := newSSE(fresp.Body).all(t)
	checkSeqs(t, evs)
	if st, r := e.storedStatus(id); st != budget.StatusCompleted || r != budget.Answered {
		t.Fatalf("status %s %s", st, r)
	}
}

// TestReplayWhileLive reconnects followers at every point of a turn that
// is still emitting (a tool reporting progress every millisecond): each
// must end with exactly the turn's events, in order, none twice.
func TestReplayWhileLive(t *testing.T) {
	g := newGate("wait")
	g.every = time.Millisecond
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, waitThenAnswer...), g.tool())})
	acc := decode[server.TurnAccepted](t, e.do("POST", "/v1/turns", map[string]any{"input": "go", "detach": true}), http.StatusAccepted)
	<-g.started

	const followers = 8
	var wg sync.WaitGroup
	results := make([][]sseEvent, followers)
	errs := make(chan error, followers)
	for f := range followers {
		wg.Go(func() {
			var got []sseEvent
			last := int64(0)
			for hop := 0; ; hop++ {
				var resp *http.Response
				var err error
				// Alternate the two ways of resuming.
				if hop%2 == 0 {
					resp, err = e.doCtx(t.Context(), "GET", "/v1/turns/"+acc.TurnID+"/events", nil, "Last-Event-ID", fmt.Sprint(last))
				} else {
					resp, err = e.doCtx(t.Context(), "GET", fmt.Sprintf("/v1/turns/%s/events?after=%d", acc.TurnID, last), nil)
				}
				if err != nil {
					errs <- err
					return
				}
				if resp.StatusCode == http.StatusNoContent {
					resp.Body.Close()
					break
				}
				sse := newSSE(resp.Body)
				// Read a few events (more on later hops), then drop.
				ended := false
				for n := 0; n < 3+f+hop; n++ {
					ev, err := sse.next()
					if err == io.EOF {
						ended = true
						break
					}
					if err != nil {
						errs <- err
						resp.Body.Close()
						return
					}
					got = append(got, ev)
					last = ev.id
				}
				resp.Body.Close()
				if ended {
					break
				}
				if hop == 20 {
					g.open() // enough hops while live; let the turn end
				}
			}
			results[f] = got
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	rec := e.record(acc.TurnID)
	for f, got := range results {
		if len(got) != len(rec.Events) {
			t.Fatalf("follower %d got %d events, the turn has %d", f, len(got), len(rec.Events))
		}
		checkSeqs(t, got)
		for i := range got {
			if got[i].data != string(rec.Events[i]) {
				t.Fatalf("follower %d, event %d differs", f, i)
			}
		}
	}
	if rec.ToolCalls[0].ProgressCount < 20 {
		t.Fatalf("the turn was not live enough: %d progress reports", rec.ToolCalls[0].ProgressCount)
	}
}

func TestEventsOfAnEndedTurn(t *testing.T) {
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, `{"text": "hi"}`))})
	rec := decode[rawRecord](t, e.do("POST", "/v1/turns", map[string]any{"input": "hello"}), http.StatusOK)
	n := len(rec.Events)
	resp := e.do("GET", fmt.Sprintf("/v1/turns/%s/events?after=%d", rec.TurnID, n-2), nil)
	evs := newSSE(resp.Body).all(t)
	resp.Body.Close()
	if len(evs) != 2 || evs[0].id != int64(n-1) || evs[1].typ != "turn_finished" {
		t.Fatalf("replay after %d: %+v", n-2, evs)
	}
	// Nothing left: 204 tells an EventSource to stop reconnecting.
	resp = e.do("GET", "/v1/turns/"+rec.TurnID+"/events", nil, "Last-Event-ID", fmt.Sprint(n))
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for _, c := range []struct {
		path   string
		hdr    []string
		status int
	}{
		{"/v1/turns/t_nope/events", nil, http.StatusNotFound},
		{"/v1/turns/" + rec.TurnID + "/events?after=x", nil, http.StatusBadRequest},
		{"/v1/turns/" + rec.TurnID + "/events", []string{"Last-Event-ID", "-3"}, http.StatusBadRequest},
	} {
		decode[apiError](t, e.do("GET", c.path, nil, c.hdr...), c.status)
	}
}

// TestReplayOfALongAnswer: a turn_finished with a long answer, replayed
// from the store, is the record's event byte for byte (its answer and
// message escaped a piece at a time as the stream writes them).
func TestReplayOfALongAnswer(t *testing.T) {
	long := strings.Repeat("<b>a & b</b>\u2028 é \"x\"\n", 8000)
	line, _ := json.Marshal(map[string]string{"text": long})
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, string(line)))})
	rec := decode[rawRecord](t, e.do("POST", "/v1/turns", map[string]any{"input": "hello"}), http.StatusOK)
	n := len(rec.Events)
	resp := e.do("GET", fmt.Sprintf("/v1/turns/%s/events?after=%d", rec.TurnID, n-1), nil)
	evs := newSSE(resp.Body).all(t)
	resp.Body.Close()
	if len(evs) != 1 || evs[0].typ != "turn_finished" {
		t.Fatalf("replay after %d: %d events", n-1, len(evs))
	}
	if evs[0].data != string(rec.Events[n-1]) {
		t.Fatalf("the replayed turn_finished (%d bytes) is not the record's (%d bytes)", len(evs[0].data), len(rec.Events[n-1]))
	}
	var fin event.TurnFinished
	if err := json.Unmarshal([]byte(evs[0].data), &fin); err != nil || fin.Answer != long || fin.Message != long {
		t.Fatalf("the replayed answer: %d bytes, message %d bytes (%v); want %d", len(fin.Answer), len(fin.Message), err, len(long))
	}
}

func TestCancelRoute(t *testing.T) {
	g := newGate("wait")
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, waitThenAnswer...), g.tool())})
	acc := decode[server.TurnAccepted](t, e.do("POST", "/v1/turns", map[string]any{"input": "go", "detach": true}), http.StatusAccepted)
	<-g.started
	rec := decode[rawRecord](t, e.do("POST", "/v1/turns/"+acc.TurnID+"/cancel", nil), http.StatusOK)
	if rec.Status != budget.StatusCancelled || rec.StopReason != budget.Cancelled || !strings.HasPrefix(rec.Message, "Cancelled by the client") {
		t.Fatalf("record %+v", rec.Turn)
	}
	if ce, ok := budget.AsCancel(g.cause); !ok || ce.Reason != budget.Cancelled {
		t.Fatalf("tool stopped for %v", g.cause)
	}
	if st, r := e.storedStatus(acc.TurnID); st != budget.StatusCancelled || r != budget.Cancelled {
		t.Fatalf("stored %s %s", st, r)
	}
	er := decode[apiError](t, e.do("POST", "/v1/turns/"+acc.TurnID+"/cancel", nil), http.StatusConflict)
	if er.Error.Code != "already_ended" {
		t.Fatalf("%+v", er)
	}
	decode[apiError](t, e.do("POST", "/v1/turns/t_nope/cancel", nil), http.StatusNotFound)
}

func TestListFiltersAndOrder(t *testing.T) {
	g := newGate("wait")
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, waitThenAnswer...), g.tool())})
	var ids []string
	// Three answered, one cancelled, one running.
	for i := range 5 {
		acc := decode[server.TurnAccepted](t, e.do("POST", "/v1/turns", map[string]any{"input": fmt.Sprint("q", i), "detach": true,
			"session_id": fmt.Sprint("s", i%2)}), http.StatusAccepted)
		ids = append(ids, acc.TurnID)
		<-g.started
		switch i {
		case 3:
			decode[rawRecord](t, e.do("POST", "/v1/turns/"+acc.TurnID+"/cancel", nil), http.StatusOK)
		case 4:
		default:
			g.release <- struct{}{}
			wait.For(t, 5*time.Second, "turn end", func() bool { st, _ := e.storedStatus(acc.TurnID); return st != budget.StatusRunning })
		}
	}
	list := func(q string) string {
		l := decode[server.TurnList](t, e.do("GET", "/v1/turns"+q, nil), http.StatusOK)
		var out []string
		for _, s := range l.Turns {
			out = append(out, s.TurnID)
		}
		return strings.Join(out, " ") + "|" + l.NextBefore
	}
	j := func(idx ...int) string {
		var out []string
		for _, i := range idx {
			out = append(out, ids[i])
		}
		return strings.Join(out, " ")
	}
	for q, want := range map[string]string{
		"":                                j(4, 3, 2, 1, 0) + "|",
		"?status=completed":               j(2, 1, 0) + "|",
		"?status=running":                 j(4) + "|",
		"?stop_reason=cancelled":          j(3) + "|",
		"?stop_reason=reply_too_long":     "|",
		"?session_id=s0":                  j(4, 2, 0) + "|",
		"?session_id=s1&status=cancelled": j(3) + "|",
		"?limit=2":                        j(4, 3) + "|" + ids[3],
		"?limit=2&before=" + ids[3]:       j(2, 1) + "|" + ids[1],
	} {
		if got := list(q); got != want {
			t.Errorf("GET /v1/turns%s = %s, want %s", q, got, want)
		}
	}
	for _, q := range []string{"?status=done", "?stop_reason=bored", "?limit=0", "?limit=x", "?limit=5000"} {
		decode[apiError](t, e.do("GET", "/v1/turns"+q, nil), http.StatusBadRequest)
	}
	decode[apiError](t, e.do("GET", "/v1/turns?before=t_nope", nil), http.StatusNotFound)
	l := decode[server.TurnList](t, e.do("GET", "/v1/turns?status=running", nil), http.StatusOK)
	if s := l.Turns[0]; s.Input != "q4" || s.SessionID != "s0" || s.Status != budget.StatusRunning || s.EndedAt != nil || s.Events == 0 {
		t.Fatalf("summary %+v", s)
	}
	g.open()
}

func TestSessionHistoryReachesTheModel(t *testing.T) {
	p := scripted(t, `{"tool_calls": [{"name": "echo", "arguments": {"x": 1}}]}`, `{"text": "first"}`, `{"text": "second"}`)
	echo := goTool("echo", budget.Cooperative, time.Minute, func(_ context.Context, in json.RawMessage, _ tool.Progress) (any, error) {
		return string(in), nil
	})
	e := newEnv(t, server.Config{Agent: newAgent(t, p, echo)})
	r1 := decode[rawRecord](t, e.do("POST", "/v1/turns", map[string]any{"input": "one", "session_id": "chat-1"}), http.StatusOK)
	r2 := decode[rawRecord](t, e.do("POST", "/v1/turns", map[string]any{"input": "two", "session_id": "chat-1"}), http.StatusOK)
	if r1.Answer != "first" || r2.Answer != "second" {
		t.Fatalf("answers %q %q", r1.Answer, r2.Answer)
	}
	msgs := p.last().Messages
	roles := make([]string, len(msgs))
	for i, m := range msgs {
		roles[i] = string(m.Role)
	}
	if strings.Join(roles, ",") != "user,assistant,tool,assistant,user" || msgs[0].Content != "one" || msgs[2].Content != `{"x": 1}` ||
		msgs[3].Content != "first" || msgs[4].Content != "two" {
		t.Fatalf("the model saw %+v", msgs)
	}
	sess := decode[store.Session](t, e.do("GET", "/v1/sessions/chat-1", nil), http.StatusOK)
	if len(sess.Turns) != 2 || sess.Turns[0].TurnID != r1.TurnID || len(sess.Messages) != 6 || sess.Messages[5].Content != "second" ||
		sess.Messages[5].TurnID != r2.TurnID {
		t.Fatalf("session %+v", sess)
	}
	list := decode[server.SessionList](t, e.do("GET", "/v1/sessions", nil), http.StatusOK)
	if len(list.Sessions) != 1 || list.Sessions[0].Turns != 2 || list.Sessions[0].Title != "one" {
		t.Fatalf("sessions %+v", list)
	}
	decode[apiError](t, e.do("GET", "/v1/sessions/nope", nil), http.StatusNotFound)
}

func TestOneTurnAtATimePerSession(t *testing.T) {
	g := newGate("wait")
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, waitThenAnswer...), g.tool())})
	decode[server.TurnAccepted](t, e.do("POST", "/v1/turns", map[string]any{"input": "a", "session_id": "s", "detach": true}), http.StatusAccepted)
	<-g.started
	er := decode[apiError](t, e.do("POST", "/v1/turns", map[string]any{"input": "b", "session_id": "s"}), http.StatusConflict)
	if er.Error.Code != "session_busy" {
		t.Fatalf("%+v", er)
	}
	// Another session is free.
	decode[server.TurnAccepted](t, e.do("POST", "/v1/turns", map[string]any{"input": "c", "session_id": "s2", "detach": true}), http.StatusAccepted)
	<-g.started
	g.open()
}

func TestBadRequests(t *testing.T) {
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, `{"text": "hi"}`)), MaxInputBytes: 100, MaxBodyBytes: 1000})
	for _, c := range []struct {
		name   string
		method string
		path   string
		body   string
		status int
		code   string
	}{
		{"not json", "POST", "/v1/turns", `hello`, 400, "bad_request"},
		{"unknown field", "POST", "/v1/turns", `{"input": "x", "sesion_id": "s"}`, 400, "bad_request"},
		{"two values", "POST", "/v1/turns", `{"input": "x"} {}`, 400, "bad_request"},
		{"empty input", "POST", "/v1/turns", `{"input": "  "}`, 400, "bad_request"},
		{"bad session", "POST", "/v1/turns", `{"input": "x", "session_id": "a b"}`, 400, "bad_request"},
		{"input too long", "POST", "/v1/turns", fmt.Sprintf(`{"input": %q}`, strings.Repeat("x", 101)), 413, "too_large"},
		{"body too long", "POST", "/v1/turns", fmt.Sprintf(`{"input": "x", "session_id": %q}`, strings.Repeat("x", 2000)), 413, "too_large"},
		{"unknown route", "GET", "/v1/nothing", ``, 404, "not_found"},
		{"wrong method", "DELETE", "/v1/turns", ``, 405, "method_not_allowed"},
		{"wrong method on the approvals", "DELETE", "/v1/turns/t_1/approvals", ``, 405, "method_not_allowed"},
		{"wrong method on a decision", "GET", "/v1/turns/t_1/approvals/c_1", ``, 405, "method_not_allowed"},
		{"wrong method on a session", "POST", "/v1/sessions/s_1", ``, 405, "method_not_allowed"},
		{"unknown route under a turn", "GET", "/v1/turns/t_1/nothing", ``, 404, "not_found"},
		{"unknown turn", "GET", "/v1/turns/t_nope", ``, 404, "not_found"},
	} {
		t.Run(c.name, func(t *testing.T) {
			er := decode[apiError](t, e.do(c.method, c.path, c.body), c.status)
			if er.Error.Code != c.code || er.Error.Message == "" {
				t.Fatalf("%+v", er)
			}
		})
	}
	if n := len(decode[server.TurnList](t, e.do("GET", "/v1/turns", nil), http.StatusOK).Turns); n != 0 {
		t.Fatalf("a bad request started %d turns", n)
	}
	// A misspelt route is met with the one meant (problem.Suggest), an id
	// in it kept; one that is near nothing with nothing.
	for path, want := range map[string]string{
		"/v1/turn":             "no API route GET /v1/turn (did you mean /v1/turns?)",
		"/v1/turns/t_1/event":  "no API route GET /v1/turns/t_1/event (did you mean /v1/turns/t_1/events?)",
		"/v1/sesions/s_1":      "no API route GET /v1/sesions/s_1 (did you mean /v1/sessions/s_1?)",
		"/v1/stat":             "no API route GET /v1/stat (did you mean /v1/stats?)",
		"/v1/nothing":          "no API route GET /v1/nothing",
		"/v1/turns/t_1/whatis": "no API route GET /v1/turns/t_1/whatis",
	} {
		if er := decode[apiError](t, e.do("GET", path, nil), 404); er.Error.Message != want {
			t.Errorf("GET %s: %q, want %q", path, er.Error.Message, want)
		}
	}
	for path, allow := range map[string]string{"/v1/turns": "POST, GET, HEAD", "/v1/turns/t_1/approvals/c_1": "POST"} {
		resp := e.do("PUT", path, nil)
		resp.Body.Close()
		if got := resp.Header.Get("Allow"); resp.StatusCode != http.StatusMethodNotAllowed || got != allow {
			t.Errorf("PUT %s: %d, Allow %q; want 405, Allow %q", path, resp.StatusCode, got, allow)
		}
	}

	// An error quotes at most 200 characters of what the client sent.
	long := "t_" + strings.Repeat("x", 10000)
	for _, c := range []struct {
		method, path string
		hdr          []string
		status       int
	}{
		{"GET", "/v1/turns/" + long, nil, 404},
		{"GET", "/v1/turns/" + long + "/events", nil, 404},
		{"POST", "/v1/turns/" + long + "/cancel", nil, 404},
		{"GET", "/v1/sessions/" + long, nil, 404},
		{"GET", "/v1/" + long, nil, 404},
		{"PUT", "/v1/turns/" + long, nil, 405},
		{"GET", "/v1/turns/t_1/events", []string{"Last-Event-ID", long}, 400},
		{"GET", "/v1/turns/t_1/events?after=" + long, nil, 400},
		{"GET", "/v1/turns?before=" + long, nil, 404},
	} {
		er := decode[apiError](t, e.do(c.method, c.path, nil, c.hdr...), c.status)
		if n := utf8.RuneCountInString(er.Error.Message); n > 300 || !strings.Contains(er.Error.Message, strings.Repeat("x", 150)) ||
			!strings.Contains(er.Error.Message, "…") {
			t.Errorf("%s %.40s…: %d characters: %.300s", c.method, c.path, n, er.Error.Message)
		}
	}
}

func TestTokenAuth(t *testing.T) {
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, `{"text": "hi"}`)), Token: "s3cret"})
	for _, c := range []struct {
		path   string
		auth   string
		status int
	}{
		{"/v1/turns", "", 401},
		{"/v1/turns", "Bearer wrong", 401},
		{"/v1/turns", "Basic czNjcmV0", 401},
		{"/v1/turns", "Bearer s3cret", 200},
		{"/v1/turns", "bearer s3cret", 200},
		{"/v1/sessions/x", "", 401},
		{"/metrics", "", 401},
		{"/metrics", "Bearer s3cret", 200},
		{"/healthz", "", 200},
		{"/", "", 200},
	} {
		var hdr []string
		if c.auth != "" {
			hdr = []string{"Authorization", c.auth}
		}
		resp := e.do("GET", c.path, nil, hdr...)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status {
			t.Errorf("GET %s with %q: %d, want %d", c.path, c.auth, resp.StatusCode, c.status)
		}
		if c.status == 401 && (resp.Header.Get("WWW-Authenticate") == "" || !strings.Contains(string(b), `"unauthorized"`)) {
			t.Errorf("401 without a JSON error or challenge: %v %s", resp.Header, b)
		}
	}
	resp := e.do("POST", "/v1/turns", map[string]any{"input": "x"})
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("POST without token: %d", resp.StatusCode)
	}
}

// fakeAddr is a loopback listener that claims another address, so the
// refusal can be tested without binding a public interface.
type fakeAddr struct {
	net.Listener
	addr string
}

func (f fakeAddr) Addr() net.Addr { a, _ := net.ResolveTCPAddr("tcp", f.addr); return a }

func TestNonLoopbackNeedsAToken(t *testing.T) {
	for addr, ok := range map[string]bool{"127.0.0.1:8080": true, "localhost:80": true, "[::1]:8080": true, "127.1.2.3:1": true,
		"0.0.0.0:8080": false, ":8080": false, "192.168.1.5:8080": false, "[::]:80": false, "example.com:80": false} {
		err := server.CheckAddr(addr, "")
		if (err == nil) != ok {
			t.Errorf("CheckAddr(%q) = %v", addr, err)
		}
		if err != nil && !strings.Contains(err.Error(), "TIMEBOX_TOKEN") {
			t.Errorf("message %q does not say what to do", err)
		}
		if server.CheckAddr(addr, "tok") != nil {
			t.Errorf("CheckAddr(%q) with a token refused", addr)
		}
	}
	srv, err := server.New(server.Config{Agent: newAgent(t, scripted(t, `{"text": "hi"}`)), Store: store.NewMemory()})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	err = srv.Serve(t.Context(), fakeAddr{ln, "0.0.0.0:8080"})
	if err == nil || !strings.Contains(err.Error(), "refusing to serve on 0.0.0.0:8080 without a token") {
		t.Fatalf("Serve: %v", err)
	}
}

func TestBrowserGuards(t *testing.T) {
	srv, err := server.New(server.Config{Agent: newAgent(t, scripted(t, `{"text": "hi"}`)), Store: store.NewMemory()})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, method, host, origin string
		status                     int
	}{
		{"dns rebinding", "GET", "evil.example:8080", "", 403},
		{"loopback name", "GET", "localhost:8080", "", 200},
		{"loopback name in capitals", "GET", "LocalHost:8080", "", 200},
		{"cross-site post", "POST", "127.0.0.1:8080", "https://evil.example", 403},
		{"same-origin post", "POST", "127.0.0.1:8080", "http://127.0.0.1:8080", 400},
		{"curl post", "POST", "127.0.0.1:8080", "", 400},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest(c.method, "http://"+c.host+"/v1/turns", strings.NewReader("{}"))
			if c.origin != "" {
				r.Header.Set("Origin", c.origin)
			}
			w := httptest.NewRecorder()
			srv.ServeHTTP(w, r)
			if w.Code != c.status {
				t.Fatalf("%d, want %d: %s", w.Code, c.status, w.Body)
			}
		})
	}
}

// TestHeadAndAcceptOfStreams: HEAD on a live turn's event stream answers
// its headers and ends, rather than following the turn (and holding the
// client's connection) until it ends; a POST streams when it accepts
// text/event-stream in any case, and not when it gives it q=0.
func TestHeadAndAcceptOfStreams(t *testing.T) {
	g := newGate("wait")
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, waitThenAnswer...), g.tool())})
	acc := decode[server.TurnAccepted](t, e.do("POST", "/v1/turns", map[string]any{"input": "hi", "detach": true}), http.StatusAccepted)
	<-g.started
	// HEAD, then another request on the same connection, as a client's
	// pool sends them: the second is answered while the turn still runs.
	c, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	host := strings.TrimPrefix(e.url, "http://")
	fmt.Fprintf(c, "HEAD /v1/turns/%s/events HTTP/1.1\r\nHost: %s\r\n\r\nGET /healthz HTTP/1.1\r\nHost: %s\r\n\r\n", acc.TurnID, host, host)
	br := bufio.NewReader(c)
	head, err := http.ReadResponse(br, &http.Request{Method: "HEAD"})
	if err != nil {
		t.Fatalf("HEAD while the turn runs: %v", err)
	}
	if head.StatusCode != http.StatusOK || head.Header.Get("Content-Type") != "text/event-stream" {
		t.Errorf("HEAD: %d %q", head.StatusCode, head.Header.Get("Content-Type"))
	}
	next, err := http.ReadResponse(br, &http.Request{Method: "GET"})
	if err != nil {
		t.Fatalf("the request after HEAD, on its connection, while the turn runs: %v", err)
	}
	next.Body.Close()
	g.open()
	for accept, streams := range map[string]bool{
		"Text/Event-Stream":                          true,
		"application/json, text/event-stream;q=0":    false,
		"text/event-stream; q=0.5, application/json": true,
		"application/json":                           false,
	} {
		q := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, `{"text": "hi"}`))})
		resp := q.do("POST", "/v1/turns", map[string]any{"input": "hi"}, "Accept", accept)
		resp.Body.Close()
		if got := strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"); got != streams {
			t.Errorf("Accept %q: streamed %v, want %v", accept, got, streams)
		}
	}
}

func TestShutdownGraceThenCancel(t *testing.T) {
	slow, quick := newGate("wait"), newGate("quick")
	p := scripted(t, `{"tool_calls": [{"name": "wait"}]}`, `{"text": "never"}`)
	q := scripted(t, `{"tool_calls": [{"name": "quick"}]}`, `{"text": "quick answer"}`)
	quickTool := goTool("quick", budget.Cooperative, time.Minute, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
		quick.started <- struct{}{}
		time.Sleep(150 * time.Millisecond) // ends inside the grace
		return "ok", nil
	})
	// Two agents behind one server: route by input.
	a1, a2 := newAgent(t, p, slow.tool()), newAgent(t, q, quickTool)
	e := newEnv(t, server.Config{Agent: routeBy{"slow": a1, "quick": a2}, ShutdownGrace: 400 * time.Millisecond})

	resp, sse := e.stream(t.Context(), map[string]any{"input": "slow"})
	defer resp.Body.Close()
	slowID := resp.Header.Get(server.HeaderTurnID)
	sse.until(t, "tool_started")
	qa := decode[server.TurnAccepted](t, e.do("POST", "/v1/turns", map[string]any{"input": "quick", "detach": true}), http.StatusAccepted)
	<-quick.started

	began := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- e.stop() }()
	// The stream sees the turn end with shutdown, after the grace.
	rest := sse.all(t)
	last := rest[len(rest)-1]
	if last.typ != "turn_finished" || !strings.Contains(last.data, `"stop_reason":"shutdown"`) {
		t.Fatalf("stream ended with %+v", last)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	if took < 400*time.Millisecond || took > 3*time.Second {
		t.Fatalf("shutdown took %s with a 400ms grace", took)
	}
	if ce, ok := budget.AsCancel(slow.cause); !ok || ce.Reason != budget.Shutdown {
		t.Fatalf("slow tool stopped for %v", slow.cause)
	}
	// Every record is stored when Serve returns.
	if st, r := e.storedStatus(slowID); st != budget.StatusCancelled || r != budget.Shutdown {
		t.Fatalf("slow turn %s %s", st, r)
	}
	if st, r := e.storedStatus(qa.TurnID); st != budget.StatusCompleted || r != budget.Answered {
		t.Fatalf("quick turn %s %s", st, r)
	}
	rec, _ := e.st.Turn(context.Background(), slowID)
	if !strings.Contains(rec.Message, "the server is shutting down") {
		t.Fatalf("message %q", rec.Message)
	}
	// A shut-down server starts nothing.
	w := httptest.NewRecorder()
	e.srv.ServeHTTP(w, httptest.NewRequest("POST", "http://127.0.0.1/v1/turns", strings.NewReader(`{"input": "late"}`)))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("POST after shutdown: %d %s", w.Code, w.Body)
	}
	w = httptest.NewRecorder()
	e.srv.ServeHTTP(w, httptest.NewRequest("GET", "http://127.0.0.1/healthz", nil))
	if w.Code != http.StatusServiceUnavailable {
		t.Fatalf("healthz after shutdown: %d", w.Code)
	}
}

func TestEndGraceCancelsAtOnce(t *testing.T) {
	g := newGate("wait")
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, waitThenAnswer...), g.tool()), ShutdownGrace: time.Hour})
	acc := decode[server.TurnAccepted](t, e.do("POST", "/v1/turns", map[string]any{"input": "go", "detach": true}), http.StatusAccepted)
	<-g.started
	stopped := make(chan error, 1)
	go func() { stopped <- e.stop() }()
	wait.For(t, time.Second, "draining", func() bool {
		resp, err := e.doCtx(t.Context(), "GET", "/healthz", nil)
		if err != nil {
			return true // the listener is already closed
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	e.srv.EndGrace()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("EndGrace did not end the grace")
	}
	if _, r := e.storedStatus(acc.TurnID); r != budget.Shutdown {
		t.Fatalf("stop reason %s", r)
	}
}

// routeBy runs each turn on the agent named by its input.
type routeBy map[string]*agent.Agent

func (r routeBy) Run(ctx context.Context, in agent.Input, sinks ...event.Sink) *agent.Result {
	return r[in.Text].Run(ctx, in, sinks...)
}

func TestLateResultIsStored(t *testing.T) {
	release := make(chan struct{})
	stubborn := goTool("stubborn", budget.Cooperative, 100*time.Millisecond, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
		<-release // ignores its context: it will be abandoned
		return "late but here", nil
	})
	// The late result reaches the server through the turn's own sink.
	a := newAgent(t, scripted(t, `{"tool_calls": [{"name": "stubborn"}]}`, `{"text": "went on without it"}`), stubborn)
	e := newEnv(t, server.Config{Agent: a})
	rec := decode[rawRecord](t, e.do("POST", "/v1/turns", map[string]any{"input": "go"}), http.StatusOK)
	type summary struct {
		Status                budget.Status
		Abandoned, LateResult bool
	}
	if diff := cmp.Diff(summary{budget.StatusCompleted, true, false}, summary{rec.Status, rec.ToolCalls[0].Abandoned, rec.ToolCalls[0].LateResult}); diff != "" {
		t.Fatalf("record (-want +got):\n%s", diff)
	}
	close(release)
	wait.For(t, 2*time.Second, "the late result stored", func() bool {
		r, err := e.st.Turn(context.Background(), rec.TurnID)
		return err == nil && r.ToolCalls[0].LateResult && r.ToolCalls[0].LateOutput == "late but here"
	})
	wait.For(t, 2*time.Second, "the abandoned call to return", func() bool { return tool.AbandonedRunning() == 0 })
}

func TestMetrics(t *testing.T) {
	slow := goTool("slow", budget.Cooperative, 50*time.Millisecond, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	// The model also calls tools the agent does not have: their names are
	// its own text, and go under one label.
	p := scripted(t, `{"tool_calls": [{"name": "slow"}, {"name": "user said: my password is hunter2"}, {"name": "ghost"}]}`, `{"text": "it timed out"}`)
	e := newEnv(t, server.Config{Agent: newAgent(t, p, slow)})
	resp, sse := e.stream(t.Context(), map[string]any{"input": "go"})
	sse.all(t)
	resp.Body.Close()
	mresp := e.do("GET", "/metrics", nil)
	b, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	text := string(b)
	for _, want := range []string{
		`timebox_tool_call_duration_seconds_count{outcome="timed_out",tool="slow"} 1`,
		`timebox_tool_call_duration_seconds_count{outcome="error",tool="(unknown)"} 2`,
		`timebox_timeouts_total{phase="tool"} 1`,
		`timebox_turns_total{status="completed",stop_reason="answered"} 1`,
		`timebox_abandoned_calls_running 0`,
		`timebox_turns_running 0`,
		`timebox_event_delivery_seconds_count`,
		`timebox_events_delivered_total`,
		`go_goroutines`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(text, "hunter2") || strings.Contains(text, "ghost") {
		t.Errorf("a tool name the model made up is a label")
	}
}

// TestARefusedTurnStartIsAStoreError: a turn the store could not begin
// counts in timebox_store_errors_total, as every failed store write does;
// it was only logged.
func TestARefusedTurnStartIsAStoreError(t *testing.T) {
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, `{"text": "hi"}`)), Store: awayStore{store.NewMemory()}})
	resp := e.do("POST", "/v1/turns", map[string]any{"input": "go"})
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("POST: %d", resp.StatusCode)
	}
	mresp := e.do("GET", "/metrics", nil)
	b, _ := io.ReadAll(mresp.Body)
	mresp.Body.Close()
	if want := `timebox_store_errors_total{op="begin_turn"} 1`; !strings.Contains(string(b), want) {
		t.Errorf("metrics lack %s", want)
	}
}

func TestHealthzAndPage(t *testing.T) {
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, `{"text": "hi"}`))})
	h := decode[map[string]any](t, e.do("GET", "/healthz", nil), http.StatusOK)
	if h["status"] != "ok" {
		t.Fatalf("%v", h)
	}
	resp := e.do("GET", "/", nil)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), "text/html") || !strings.Contains(string(b), "timebox") {
		t.Fatalf("GET /: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("GET / Content-Security-Policy %q", csp)
	}
	// The page's script and styles are embedded files of their own (the
	// policy allows nothing inline).
	for path, typ := range map[string]string{"/app.js": "javascript", "/app.css": "text/css"} {
		resp := e.do("GET", path, nil)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Type"), typ) || len(b) < 1000 {
			t.Errorf("GET %s: %d %s, %d bytes", path, resp.StatusCode, resp.Header.Get("Content-Type"), len(b))
		}
	}
	if strings.Contains(string(b), "<script>") || strings.Contains(string(b), "<style>") {
		t.Errorf("index.html has inline script or style, which the policy blocks")
	}
}

// TestRunningElsewhere follows a turn that another process (here: a
// recorder writing straight to the shared store) is running.
func TestRunningElsewhere(t *testing.T) {
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, `{"text": "hi"}`))})
	rec := store.NewRecorder(e.st)
	if err := rec.Begin(context.Background(), store.TurnStart{TurnID: "t_cli", Input: "from the CLI", StartedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	em := event.NewEmitter("t_cli", rec)
	em.Emit(&event.TurnStarted{Input: "from the CLI"})
	resp := e.do("GET", "/v1/turns/t_cli/events", nil)
	defer resp.Body.Close()
	sse := newSSE(resp.Body)
	if ev, err := sse.next(); err != nil || ev.typ != "turn_started" {
		t.Fatalf("%+v %v", ev, err)
	}
	er := decode[apiError](t, e.do("POST", "/v1/turns/t_cli/cancel", nil), http.StatusConflict)
	if er.Error.Code != "not_here" {
		t.Fatalf("%+v", er)
	}
	em.Emit(&event.LLMDelta{Text: "hi"})
	em.Emit(&event.TurnFinished{Status: budget.StatusCompleted, StopReason: budget.Answered})
	if err := rec.Finish(context.Background(), &event.Turn{TurnID: "t_cli", Input: "from the CLI", Status: budget.StatusCompleted,
		StopReason: budget.Answered, StartedAt: time.Now(), EndedAt: time.Now(), Events: em.Log()}, []model.Message{}); err != nil {
		t.Fatal(err)
	}
	evs := sse.all(t)
	if len(evs) != 2 || evs[1].typ != "turn_finished" {
		t.Fatalf("%+v", evs)
	}
}

func TestNewNeedsAgentAndStore(t *testing.T) {
	if _, err := server.New(server.Config{}); err == nil {
		t.Fatal("New without agent and store worked")
	}
}

func TestCheckToken(t *testing.T) {
	for _, c := range []struct {
		token, warning, err string
	}{
		{"0123456789abcdef", "", ""},
		{"short", "is shorter than 16 characters; a short token can be guessed", ""},
		{"", "", "is empty"},
		{" \t", "", "is only whitespace"},
		{"two words-and-more-text", "", "holds whitespace or a control character"},
		{"0123456789abcdef\n", "", "holds whitespace or a control character"},
	} {
		w, err := server.CheckToken(c.token)
		if !strings.HasPrefix(w, c.warning) || (c.warning == "") != (w == "") ||
			(c.err == "") != (err == nil) || (err != nil && !strings.HasPrefix(err.Error(), c.err)) {
			t.Errorf("CheckToken(%q) = %q, %v; want %q, %q", c.token, w, err, c.warning, c.err)
		}
	}
	st := openStore(t)
	defer st.Close()
	if _, err := server.New(server.Config{Agent: newAgent(t, scripted(t, `{"text": "hi"}`)), Store: st, Token: "   "}); err == nil || !strings.Contains(err.Error(), "token: is only whitespace") {
		t.Errorf("server.New with a blank token: %v", err)
	}
}

// TestAStopDoesNotWaitForSilentConnections: a connection on which no
// request has come — a browser's preconnected socket beside the page —
// does not hold the server's stop: http.Server.Shutdown alone waited until
// it was 5s old.
func TestAStopDoesNotWaitForSilentConnections(t *testing.T) {
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, `{"text": "hi"}`))})
	c, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	began := time.Now()
	if err := e.stop(); err != nil {
		t.Errorf("Serve: %v", err)
	}
	// The stop takes milliseconds; Shutdown's own wait is 5s and more.
	if took := time.Since(began); took > 3*time.Second {
		t.Errorf("stopped after %v with a silent connection open", took)
	}
}
