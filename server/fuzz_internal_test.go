package server

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/event"
)

// FuzzEventsAfter feeds arbitrary Last-Event-ID headers and ?after= values
// to the parser of where a follower resumes. An accepted value is a seq
// ≥ 0, written in decimal digits only, that prints back to itself; a refused one gets a message that names
// the header or parameter and quotes at most maxShown characters of it.
// The header wins over the parameter. The corpus is
// testdata/fuzz/FuzzEventsAfter.
func FuzzEventsAfter(f *testing.F) {
	for _, s := range [][2]string{{"", ""}, {"7", ""}, {"", "12"}, {" 3 ", "x"}, {"-1", ""}, {"", "9223372036854775808"},
		{"1e3", ""}, {"", "0x10"}, {"٣", ""}, {strings.Repeat("9", 300), ""}} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, header, after string) {
		r := httptest.NewRequest("GET", "/v1/turns/t_1/events?after="+escapeAll(after), nil)
		if header != "" {
			r.Header["Last-Event-Id"] = []string{header}
		}
		n, err := eventsAfter(r)
		used, what := header, "Last-Event-ID"
		if header == "" {
			used, what = r.URL.Query().Get("after"), `"after"`
		}
		if err != nil {
			msg := err.Error()
			if !strings.HasPrefix(msg, what+" must be an event seq") || utf8.RuneCountInString(msg) > maxShown+100 {
				t.Fatalf("message %q", msg)
			}
			return
		}
		if used == "" {
			if n != 0 {
				t.Fatalf("nothing given, resumes after %d", n)
			}
			return
		}
		// Accepted: decimal digits only (no sign, no spaces), perhaps
		// with leading zeros.
		if strings.Trim(used, "0123456789") != "" {
			t.Fatalf("%q accepted as %d: not digits only", used, n)
		}
		digits := strings.TrimLeft(used, "0")
		if digits == "" {
			digits = "0"
		}
		if n < 0 || digits != strconv.FormatInt(n, 10) {
			t.Fatalf("%q read as %d", used, n)
		}
		back, err := eventsAfter(httptest.NewRequest("GET", "/x?after="+strconv.FormatInt(n, 10), nil))
		if err != nil || back != n {
			t.Fatalf("%d does not read back: %d, %v", n, back, err)
		}
	})
}

// escapeAll percent-encodes every byte, so that any value reaches the query.
func escapeAll(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		b.WriteString("%" + strconv.FormatInt(int64(c)+0x100, 16)[1:])
	}
	return b.String()
}

// FuzzTurnRequest feeds arbitrary bodies to POST /v1/turns's reader. It
// accepts exactly the requests the API describes (one JSON object, known
// fields, no key twice at any depth, an input that is not blank, is UTF-8
// and within the limit, a well-formed session id), and the accepted
// request, written back as JSON, reads back the same. Anything else gets a 400 or 413 whose body is
// the API's error object with a short message. The corpus is
// testdata/fuzz/FuzzTurnRequest.
func FuzzTurnRequest(f *testing.F) {
	for _, s := range []string{
		`{"input": "hello"}`,
		`{"session_id": "s-1.a:b_c", "input": "hi", "detach": true}`,
		`{"input": "  "}`, `{"input": "x", "sesion_id": "s"}`, `{"input": "x"} {}`, `[]`, `null`, ``,
		`{"input": "\ud800"}`, `{"input": "x", "session_id": "a b"}`, `{"input": 5}`,
		`{"input": "` + strings.Repeat("x", 300) + `"}`,
		`{"` + strings.Repeat("k", 600) + `": 1}`,
		`{"input": "x", "budgets": {"turn": "1s", "max_steps": 5}}`, `{"input": "x", "budgets": {"turn": "1s", "turn": "10m"}}`,
		`{"input": "x", "budgets": null}`, `{"input": "x", "budgets": ["turn"]}`, `{"input": "x", "Budgets": {}}`,
	} {
		f.Add([]byte(s))
	}
	s := &Server{cfg: Config{MaxBodyBytes: 1 << 12, MaxInputBytes: 256}}
	f.Fuzz(func(t *testing.T, body []byte) {
		w := httptest.NewRecorder()
		req, ok := s.readTurnRequest(w, httptest.NewRequest("POST", "/v1/turns", bytes.NewReader(body)))
		if ok {
			if strings.TrimSpace(req.Input) == "" || !utf8.ValidString(req.Input) || len(req.Input) > s.cfg.MaxInputBytes ||
				(req.SessionID != "" && !agent.ValidSessionID(req.SessionID)) {
				t.Fatalf("accepted %+v", req)
			}
			if w.Code != http.StatusOK || w.Body.Len() != 0 {
				t.Fatalf("accepted, and answered %d %q", w.Code, w.Body.String())
			}
			if !eachKeyOnce(body) {
				t.Fatalf("accepted %s, which has a key twice", body)
			}
			again, _ := json.Marshal(req)
			back, ok := s.readTurnRequest(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/turns", bytes.NewReader(again)))
			if len(req.Budgets) == 0 {
				req.Budgets = nil // {} is written as no budgets
			}
			if !ok || !reflect.DeepEqual(back, req) {
				t.Fatalf("%s reads back as %+v, %v", again, back, ok)
			}
			return
		}
		checkRefusal(t, w)
	})
}

// checkRefusal fails t unless w is a refused body's answer: a 400 or 413
// whose body is the API's error object with a short message.
func checkRefusal(t *testing.T, w *httptest.ResponseRecorder) {
	t.Helper()
	if w.Code != http.StatusBadRequest && w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("refused with %d", w.Code)
	}
	var eb errorBody
	if err := json.Unmarshal(w.Body.Bytes(), &eb); err != nil || eb.Error.Message == "" ||
		(eb.Error.Code != "bad_request" && eb.Error.Code != "too_large") {
		t.Fatalf("refused with body %q (%v)", w.Body.String(), err)
	}
	if n := utf8.RuneCountInString(eb.Error.Message); n > 2*maxShown+200 {
		t.Fatalf("a message of %d characters: %.300s…", n, eb.Error.Message)
	}
}

// FuzzDecisionRequest feeds arbitrary bodies to the reader of POST
// /v1/turns/{id}/approvals/{call_id}, which reads them by the turn
// request's rule. It accepts exactly the decisions the API describes (one
// JSON object, known fields, no key twice, "approve" or "deny", a reason
// and by within maxReason), which read the same to encoding/json alone and
// read back the same written as JSON; anything else gets a 400 or 413 with
// the API's error object.
func FuzzDecisionRequest(f *testing.F) {
	for _, s := range []string{
		`{"decision": "approve"}`, `{"decision": "deny", "reason": "not today", "by": "alice"}`,
		`{"DECISION":"deny","decision":"approve","Reason":"r"} trailing garbage`,
		`{"decision": "deny", "decision": "approve"}`, `{"decision": "approve"} {}`, `{"Decision": "approve"}`,
		`{"decision": "perhaps"}`, `{"decision": "approve", "reason": "` + strings.Repeat("x", 5000) + `"}`,
		`{"decision": "approve", "reason": "` + strings.Repeat("x", 9000) + `"}`,
		`[]`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	s := &Server{cfg: Config{MaxBodyBytes: 1 << 13}}
	f.Fuzz(func(t *testing.T, body []byte) {
		w := httptest.NewRecorder()
		req, ok := s.readDecision(w, httptest.NewRequest("POST", "/v1/turns/t_1/approvals/call_1_1", bytes.NewReader(body)))
		if !ok {
			checkRefusal(t, w)
			return
		}
		if (req.Decision != event.Approve && req.Decision != event.Deny) || len(req.Reason) > maxReason || len(req.By) > maxReason {
			t.Fatalf("accepted %+v", req)
		}
		if w.Code != http.StatusOK || w.Body.Len() != 0 {
			t.Fatalf("accepted, and answered %d %q", w.Code, w.Body.String())
		}
		if !eachKeyOnce(body) {
			t.Fatalf("accepted %s, which has a key twice", body)
		}
		var plain DecisionRequest
		if err := json.Unmarshal(body, &plain); err != nil || plain != req {
			t.Fatalf("accepted %s as %+v; encoding/json alone reads %+v (%v)", body, req, plain, err)
		}
		again, _ := json.Marshal(req)
		back, ok := s.readDecision(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/turns/t_1/approvals/call_1_1", bytes.NewReader(again)))
		if !ok || back != req {
			t.Fatalf("%s reads back as %+v, %v", again, back, ok)
		}
	})
}

// eachKeyOnce reports whether no object in the JSON text b, at any depth,
// has a key twice; b is valid JSON.
func eachKeyOnce(b []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	type level struct {
		keys     map[string]bool
		wantsKey bool
	}
	var stack []*level
	for {
		t, err := dec.Token()
		if err != nil {
			return true
		}
		var top *level
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch t {
		case json.Delim('{'):
			if top != nil && top.keys != nil {
				top.wantsKey = true
			}
			stack = append(stack, &level{keys: map[string]bool{}, wantsKey: true})
			continue
		case json.Delim('['):
			if top != nil && top.keys != nil {
				top.wantsKey = true
			}
			stack = append(stack, &level{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
			continue
		}
		if top == nil || top.keys == nil {
			continue
		}
		if top.wantsKey {
			k := t.(string)
			if top.keys[k] {
				return false
			}
			top.keys[k] = true
		}
		top.wantsKey = !top.wantsKey
	}
}
