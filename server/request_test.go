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
