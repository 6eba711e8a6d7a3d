package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
)

// TestTurnRequestIsReadExactly: the keys of POST /v1/turns are matched
// exactly and once, and an input that was not UTF-8 — an invalid byte, or
// a \u escape of half a surrogate pair, which encoding/json alone turns
// into U+FFFD without a word — is refused, while a U+FFFD the client sent
// is not.
func TestTurnRequestIsReadExactly(t *testing.T) {
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, `{"text": "hello"}`))})
	for _, c := range []struct {
		name, body string
		status     int
		says       string
	}{
		{"upper-case key", `{"INPUT": "hi"}`, 400, `unknown field "INPUT"`},
		{"capitalised detach", `{"input": "hi", "Detach": true}`, 400, `unknown field "Detach"`},
		{"a key twice", `{"input": "hi", "input": "there"}`, 400, `"input" given twice`},
		{"an invalid byte", "{\"input\": \"hi \xff\"}", 400, "not valid UTF-8"},
		{"half a surrogate pair", `{"input": "hi \ud800"}`, 400, "not valid UTF-8"},
		{"a lone low surrogate", `{"input": "hi \udc00 there"}`, 400, "not valid UTF-8"},
		{"U+FFFD escaped", `{"input": "hi \ufffd"}`, 200, ""},
		{"U+FFFD as itself", "{\"input\": \"hi \xef\xbf\xbd\"}", 200, ""},
		{"a pair", `{"input": "hi \ud83d\ude00"}`, 200, ""},
		{"a budget twice", `{"input": "hi", "budgets": {"turn": "1s", "turn": "10m"}}`, 400, `budgets: field "turn" given twice`},
		{"budgets not an object", `{"input": "hi", "budgets": ["turn", "1s"]}`, 400, "budgets: not a JSON object"},
		{"no budgets", `{"input": "hi", "budgets": null}`, 200, ""},
		{"a budget once", `{"input": "hi", "budgets": {"turn": "1m", "max_steps": 5}}`, 200, ""},
		// Said in JSON's words, not Go's.
		{"input a number", `{"input": 5}`, 400, `"input" must be a string, not a number`},
		{"input an array", `{"input": ["a"]}`, 400, `"input" must be a string, not an array`},
		{"detach a string", `{"input": "hi", "detach": "yes"}`, 400, `"detach" must be true or false, not a string`},
		{"session an object", `{"input": "hi", "session_id": {}}`, 400, `"session_id" must be a string, not an object`},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := e.do("POST", "/v1/turns", c.body, "Content-Type", "application/json")
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var er apiError
			json.Unmarshal(b, &er)
			if resp.StatusCode != c.status || !strings.Contains(er.Error.Message, c.says) {
				t.Errorf("%d %s; want %d saying %q", resp.StatusCode, b, c.status, c.says)
			}
		})
	}
}

// TestDecisionRequestIsReadExactly: the body of POST
// /v1/turns/{id}/approvals/{call_id} is read by the turn request's rule —
// one JSON object and nothing after it, its keys matched exactly and once
// — and one over the server's limit is a 413. A refused body decides
// nothing: the call still waits, and a decision sent right is taken.
func TestDecisionRequestIsReadExactly(t *testing.T) {
	e := newEnv(t, server.Config{Agent: newAgent(t, scripted(t, deployThenAnswer...), deployTool(0)), MaxBodyBytes: 1000})
	resp, sse := e.stream(context.Background(), map[string]any{"input": "deploy"})
	defer resp.Body.Close()
	turnID := resp.Header.Get(server.HeaderTurnID)
	var asked event.ApprovalRequested
	if err := json.Unmarshal([]byte(waitFor(t, sse, "approval_requested")), &asked); err != nil {
		t.Fatal(err)
	}
	path := "/v1/turns/" + turnID + "/approvals/" + asked.CallID
	for _, c := range []struct {
		name, body string
		status     int
		code, says string
	}{
		{"keys in other cases, twice, and garbage after", `{"DECISION":"deny","decision":"approve","Reason":"r"} trailing garbage`, 400, "bad_request", `unknown field "DECISION"`},
		{"a capitalised key", `{"decision": "approve", "Reason": "r"}`, 400, "bad_request", `unknown field "Reason"`},
		{"a key twice", `{"decision": "deny", "decision": "approve"}`, 400, "bad_request", `field "decision" given twice`},
		{"garbage after", `{"decision": "approve"} trailing garbage`, 400, "bad_request", "after the JSON object"},
		{"a reason that is a number", `{"decision": "approve", "reason": 5}`, 400, "bad_request", `"reason" must be a string, not a number`},
		{"a second object", `{"decision": "approve"} {"decision": "deny"}`, 400, "bad_request", "after the JSON object"},
		{"not an object", `["approve"]`, 400, "bad_request", "not a JSON object"},
		{"over the limit", `{"decision": "approve", "reason": "` + strings.Repeat("x", 2000) + `"}`, 413, "too_large", "over the server's limit of 1000 bytes"},
		{"a reason not UTF-8", "{\"decision\": \"approve\", \"reason\": \"ok \xff\"}", 400, "bad_request", "not valid UTF-8"},
		{"half a surrogate pair", `{"decision": "approve", "by": "al\ud800ice"}`, 400, "bad_request", "not valid UTF-8"},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := e.do("POST", path, c.body, "Content-Type", "application/json")
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var er apiError
			json.Unmarshal(b, &er)
			if resp.StatusCode != c.status || er.Error.Code != c.code || !strings.Contains(er.Error.Message, c.says) {
				t.Errorf("%d %s; want %d %s saying %q", resp.StatusCode, b, c.status, c.code, c.says)
			}
			list := decode[server.ApprovalList](t, e.do("GET", "/v1/turns/"+turnID+"/approvals", nil), http.StatusOK)
			if len(list.Approvals) != 1 || list.Approvals[0].Decision != "" {
				t.Fatalf("after a refused body, the approvals are %+v", list.Approvals)
			}
		})
	}
	ap := decode[store.Approval](t, e.do("POST", path, `{"decision": "deny", "reason": "not today", "by": "alice"}`), http.StatusOK)
	if ap.Decision != event.Deny || ap.Reason != "not today" || ap.By != "alice" {
		t.Fatalf("decision %+v", ap)
	}
	waitFor(t, sse, "turn_finished")
}

// secretStore fails with errors that name the database, its host and its
// user, as pgx's do.
type secretStore struct{ store.Store }

var errSecret = errors.New("failed to connect to `user=tbadmin database=prod_turns`: 10.20.30.40:5432: connection refused")

func (secretStore) Turns(context.Context, store.Filter) ([]store.TurnSummary, error) {
	return nil, errSecret
}
func (secretStore) Turn(context.Context, string) (*event.Turn, error) { return nil, errSecret }
func (secretStore) BeginTurn(context.Context, store.TurnStart) error {
	return errors.Join(store.ErrUnavailable, errSecret)
}

// TestErrorsDoNotShowTheStore: a failure of the store answers with what
// failed and the request's id; the database, host and user in the store's
// error are in the server's log, under that id, not in the body.
func TestErrorsDoNotShowTheStore(t *testing.T) {
	var logged bytes.Buffer
	e := newEnv(t, server.Config{Store: secretStore{store.NewMemory()}, Agent: newAgent(t, scripted(t, `{"text": "hello"}`)),
		Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	for _, c := range []struct {
		method, path, body string
		status             int
	}{
		{"GET", "/v1/turns", "", http.StatusInternalServerError},
		{"GET", "/v1/turns/t_x", "", http.StatusInternalServerError},
		{"POST", "/v1/turns", `{"input": "hi"}`, http.StatusServiceUnavailable},
	} {
		resp := e.do(c.method, c.path, c.body, "Content-Type", "application/json")
		var body apiError
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		id := resp.Header.Get(server.HeaderRequestID)
		if resp.StatusCode != c.status || id == "" {
			t.Fatalf("%s %s: %d, request id %q: %s", c.method, c.path, resp.StatusCode, id, b)
		}
		for _, secret := range []string{"tbadmin", "prod_turns", "10.20.30.40"} {
			if strings.Contains(string(b), secret) {
				t.Errorf("%s %s: the body shows %q: %s", c.method, c.path, secret, b)
			}
		}
		if err := json.Unmarshal(b, &body); err != nil || !strings.Contains(body.Error.Message, id) || !strings.Contains(string(b), `"request_id":"`+id+`"`) {
			t.Errorf("%s %s: the body does not name request %s: %s", c.method, c.path, id, b)
		}
		if !strings.Contains(logged.String(), "request_id="+id) || !strings.Contains(logged.String(), "10.20.30.40") {
			t.Errorf("%s %s: the log lacks the cause under request %s:\n%s", c.method, c.path, id, logged.String())
		}
	}
}
