package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/exactjson"
	"github.com/timebox-run/timebox/internal/problem"
	"github.com/timebox-run/timebox/store"
)

func (s *Server) routes() {
	mux := http.NewServeMux()
	// paths has every API route's path, whatever its method, so that a
	// wrong method (405, with Allow) is told from a wrong path (404).
	paths := http.NewServeMux()
	s.allow = map[string][]string{}
	params := queryParams()
	api := func(pattern string, h http.HandlerFunc) {
		method, path, _ := strings.Cut(pattern, " ")
		mux.Handle(pattern, s.guard(s.auth(onlyParams(pattern, params[pattern], h))))
		if s.allow[path] == nil {
			paths.Handle(path, http.NotFoundHandler())
		}
		s.allow[path] = append(s.allow[path], method)
		if method == http.MethodGet {
			s.allow[path] = append(s.allow[path], http.MethodHead) // the mux serves it
		}
	}
	api("POST /v1/turns", s.postTurn)
	api("GET /v1/turns", s.listTurns)
	api("GET /v1/turns/{id}", s.getTurn)
	api("GET /v1/turns/{id}/events", s.getEvents)
	api("POST /v1/turns/{id}/cancel", s.cancel)
	api("GET /v1/turns/{id}/approvals", s.listApprovals)
	api("POST /v1/turns/{id}/approvals/{call_id}", s.decide)
	api("GET /v1/sessions", s.listSessions)
	api("GET /v1/sessions/{id}", s.getSession)
	api("GET /v1/stats", s.getStats)
	api("GET /v1/webhooks/deliveries", s.listDeliveries)
	api("GET /v1/openapi.json", s.getOpenAPI)
	s.paths = paths
	mux.Handle("/v1/", s.guard(s.auth(s.noRoute)))
	mux.Handle("GET /metrics", s.guard(s.auth(s.metrics.ServeHTTP)))
	mux.Handle("GET /healthz", s.guard(http.HandlerFunc(s.healthz)))
	mux.Handle("/", s.guard(webHandler()))
	s.mux = mux
}

// noRoute answers a request no API route took: 405 when its path is a
// route's with another method, 404 otherwise.
func (s *Server) noRoute(w http.ResponseWriter, r *http.Request) {
	if _, path := s.paths.Handler(r); path != "" {
		w.Header().Set("Allow", strings.Join(s.allow[path], ", "))
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("%s is not allowed on %s", shown(r.Method), shown(r.URL.Path)))
		return
	}
	writeError(w, http.StatusNotFound, "not_found", fmt.Sprintf("no API route %s %s%s", shown(r.Method), shown(r.URL.Path), s.likelyRoute(r.URL.Path)))
}

// likelyRoute is " (did you mean PATH?)" for the route path a misspelt
// one was likely meant to be, or "": a route's path that differs from it
// in one segment only, a likely typo of it by problem.Suggest's rule. A
// route's {id} is the request's segment in its place, so that
// /v1/turns/t_1/event finds /v1/turns/t_1/events by its one letter.
func (s *Server) likelyRoute(path string) string {
	segs := strings.Split(path, "/")
	var near []string
	for p := range s.allow {
		ps := strings.Split(p, "/")
		if len(ps) != len(segs) {
			continue
		}
		differ := -1
		for i, seg := range ps {
			if strings.HasPrefix(seg, "{") {
				ps[i] = segs[i]
			} else if seg != segs[i] {
				if differ >= 0 {
					differ = -2
					break
				}
				differ = i
			}
		}
		if differ >= 0 && problem.Suggest(segs[differ], []string{ps[differ]}) != "" {
			near = append(near, strings.Join(ps, "/"))
		}
	}
	// Sorted, so that of two as close the same one is named every time.
	slices.Sort(near)
	return problem.DidYouMean(path, near)
}

// maxShown is how many characters of a value the client sent (an id, a
// path, a header) an error message quotes back.
const maxShown = 200

// shown cuts a value the client sent to maxShown characters for an error
// message, marking the cut, so that a megabyte-long id is not echoed whole.
// A value to be quoted is quoted first (shown(strconv.Quote(v))): quoting
// can make a byte four characters.
func shown(v string) string {
	n := 0
	for i := range v {
		if n == maxShown {
			return v[:i] + "…"
		}
		n++
	}
	return v
}

// errorBody is every API error: {"error": {"message": ..., "code": ...}}.
type errorBody struct {
	Error struct {
		Message string `json:"message"`
		Code    string `json:"code"`
		// Key, Asked and Ceiling are set for a refused budget
		// (code bad_budget): the budget's name in "budgets", the value
		// asked for, and the largest allowed when it was over that.
		Key     string `json:"key,omitempty"`
		Asked   string `json:"asked,omitempty"`
		Ceiling string `json:"ceiling,omitempty"`
		// RequestID names the request in the server's log, which has
		// the cause of a failure the message does not show (a store's
		// error names its database, host and user).
		RequestID string `json:"request_id,omitempty"`
	} `json:"error"`
}

// writeError answers an error; fill, if given, adds the detail fields.
func writeError(w http.ResponseWriter, status int, code, msg string, fill ...func(*errorBody)) {
	var b errorBody
	b.Error.Message, b.Error.Code = msg, code
	for _, f := range fill {
		f(&b)
	}
	writeJSON(w, status, b)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

// storeFailed answers a failed store read.
func (s *Server) storeFailed(w http.ResponseWriter, r *http.Request, err error, what string) {
	if errors.Is(err, store.ErrNotFound) {
		writeError(w, http.StatusNotFound, "not_found", what+" not found")
		return
	}
	if errors.Is(err, store.ErrUnavailable) {
		// The database is away: a request made again shortly, or through
		// another gateway, is answered (a person deciding a call during an
		// outage was told only that reading failed).
		w.Header().Set("Retry-After", "5")
		s.failed(w, r, http.StatusServiceUnavailable, "store_unavailable",
			"reading "+what+" from the store failed: its database cannot be reached for now; ask again shortly, or through another gateway", err)
		return
	}
	s.failed(w, r, http.StatusInternalServerError, "store_error", "reading "+what+" from the store failed", err)
}

// failed answers a failure whose cause is the operator's business, not
// the client's: a store's error names its database, its host and its
// user. The client gets what failed and the request's id; the log gets the
// cause, under the same id.
func (s *Server) failed(w http.ResponseWriter, r *http.Request, status int, code, what string, err error) {
	id := requestID(r)
	s.log.Error(what, "request_id", id, "err", err)
	writeError(w, status, code, fmt.Sprintf("%s (request %s: the server's log has the cause)", what, id), func(b *errorBody) {
		b.Error.RequestID = id
	})
}

// guard refuses requests a browser could be tricked into sending: without
// a token, only requests addressed to a loopback host are answered (a DNS
// rebinding page would address its own name), and a state-changing request
// from another origin is refused (CSRF). See
// docs/decisions/server-security.md.
func (s *Server) guard(h http.Handler) http.Handler { return guard(s.cfg.Token, h) }

// Guard returns h behind the checks `timebox serve` makes before its API,
// for another HTTP server of timebox's (`timebox mcp serve --addr`) to
// make the same ones: without a token, only requests addressed to a
// loopback host are answered; a request other than GET or HEAD from
// another origin is refused; and with a token, every request must carry
// "Authorization: Bearer <token>". Refusals are answered as the API's
// errors (403 forbidden_host or cross_origin, 401 unauthorized).
func Guard(token string, h http.Handler) http.Handler {
	return guard(token, auth(token, hashToken(token), h.ServeHTTP))
}

func guard(token string, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Content-Type-Options", "nosniff")
		if token == "" && !isLoopback(hostOnly(r.Host)) {
			writeError(w, http.StatusForbidden, "forbidden_host", fmt.Sprintf(
				"this server answers only requests for localhost (it has no token); %s is not: set --token to serve other names", shown(strconv.Quote(r.Host))))
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if o := r.Header.Get("Origin"); o != "" && !sameOrigin(o, r.Host) {
				writeError(w, http.StatusForbidden, "cross_origin", "cross-origin requests are refused")
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return strings.Trim(hostport, "[]")
}

func sameOrigin(origin, host string) bool {
	u, err := url.Parse(origin)
	return err == nil && u.Host != "" && strings.EqualFold(u.Host, host)
}

func hashToken(t string) [32]byte { return sha256.Sum256([]byte(t)) }

// auth checks the bearer token when the server has one. The comparison is
// of hashes, in constant time, so it reveals neither the token nor its
// length.
func (s *Server) auth(h http.HandlerFunc) http.Handler { return auth(s.cfg.Token, s.token, h) }

// auth is Server.auth for token, whose hash is want.
func auth(token string, want [32]byte, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token != "" {
			scheme, tok, _ := strings.Cut(r.Header.Get("Authorization"), " ")
			got := hashToken(strings.TrimSpace(tok))
			if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(got[:], want[:]) != 1 {
				w.Header().Set("WWW-Authenticate", `Bearer realm="timebox"`)
				writeError(w, http.StatusUnauthorized, "unauthorized",
					"missing or wrong token: send \"Authorization: Bearer <token>\" with the server's --token (TIMEBOX_TOKEN)")
				return
			}
		}
		h(w, r)
	})
}

func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	draining, n := s.draining, len(s.turns)
	s.mu.Unlock()
	if draining {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "shutting_down", "turns_running": n})
		return
	}
	body := map[string]any{"status": "ok", "turns_running": n}
	var backlog store.Backlog
	if b, ok := s.cfg.Store.(store.Backlogged); ok {
		if backlog = b.Backlog(); backlog.Events > 0 {
			// What the store keeps and has not stored yet: while its
			// database is away, the events of the turns, kept in memory
			// (bounded) and stored once it is back.
			body["store_behind"] = backlog
		}
	}
	if p, ok := s.cfg.Store.(pinger); ok {
		ctx, cancel := context.WithTimeout(r.Context(), pingTimeout)
		err := p.Ping(ctx)
		cancel()
		if err != nil {
			s.log.Error("health: the store is unreachable", "err", err)
			body["status"] = "store_unreachable"
			writeJSON(w, http.StatusServiceUnavailable, body)
			return
		}
	}
	if backlog.Behind() {
		body["status"] = "store_behind"
		writeJSON(w, http.StatusServiceUnavailable, body)
		return
	}
	writeJSON(w, http.StatusOK, body)
}

// pinger is a store that can tell whether it is reachable: a database
// server (store/postgres). A gateway that cannot reach the database its
// peers share answers /healthz 503, so that a load balancer sends the
// turns to the others.
type pinger interface{ Ping(context.Context) error }

// pingTimeout bounds /healthz's look at the store.
const pingTimeout = 2 * time.Second

// TurnRequest is the body of POST /v1/turns.
type TurnRequest struct {
	// SessionID names the conversation; empty starts a new one, whose id
	// the response's Timebox-Session-Id header names.
	SessionID string `json:"session_id"`
	// Input is the user's message.
	Input string `json:"input"`
	// Detach keeps the turn running when the client goes away; without an
	// event stream the response is then 202 at once (TurnAccepted).
	Detach bool `json:"detach"`
	// Budgets are this turn's own budgets, by name: "turn", "tool",
	// "step", "llm_budget" (durations such as "90s") and "max_steps",
	// "max_tool_calls" (numbers). Each may lower the agent's value; it
	// may raise it only up to server.request_max. Their source is
	// "request".
	Budgets budget.Request `json:"budgets,omitempty"`
}

// BudgetChecker is a Runner that can refuse a request's budgets before its
// turn starts, with a *budget.RequestError; *agent.Agent is one. A Runner
// that is not one gets the budgets unchecked in agent.Input.
type BudgetChecker interface {
	TurnBudgets(budget.Request) (budget.Budgets, budget.Limits, error)
}

// TurnAccepted is the 202 response to a detached POST /v1/turns without
// an event stream.
type TurnAccepted struct {
	// TurnID (turn_id) names the turn, and SessionID (session_id) its
	// session: the request's, or the one started for it.
	TurnID    string `json:"turn_id"`
	SessionID string `json:"session_id"`
	// Status is running.
	Status budget.Status `json:"status"`
	// Events is the path of the turn's event stream.
	Events string `json:"events"`
}

// Header names of POST /v1/turns's response.
const (
	HeaderTurnID    = "Timebox-Turn-Id"
	HeaderSessionID = "Timebox-Session-Id"
	// HeaderRequestID names every response's request; the server logs
	// the cause of a failure under it.
	HeaderRequestID = "Timebox-Request-Id"
)

// turnRequestKeys are the keys of a POST /v1/turns body.
var turnRequestKeys = []string{"session_id", "input", "detach", "budgets"}

func (s *Server) readTurnRequest(w http.ResponseWriter, r *http.Request) (TurnRequest, bool) {
	var req TurnRequest
	fields, ok := s.readBody(w, r, &req, turnRequestKeys, `{"session_id": "...", "input": "...", "detach": false, "budgets": {"turn": "10m"}}`)
	if !ok {
		return req, false
	}
	switch {
	case strings.TrimSpace(req.Input) == "":
		writeError(w, http.StatusBadRequest, "bad_request", `"input" is empty: send the user's message`)
	case len(req.Input) > s.cfg.MaxInputBytes:
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf(`"input" is %d bytes, over the server's limit of %d`, len(req.Input), s.cfg.MaxInputBytes))
	case !validText(fields["input"], req.Input):
		writeError(w, http.StatusBadRequest, "bad_request", `"input" is not valid UTF-8 (an invalid byte, or a \u escape of half a surrogate pair)`)
	case req.SessionID != "" && !agent.ValidSessionID(req.SessionID):
		writeError(w, http.StatusBadRequest, "bad_request", `"session_id" must be `+agent.SessionIDForm)
	default:
		return req, true
	}
	return req, false
}

// readBody reads r's body into v, which must be one JSON object whose keys
// are keys, matched exactly, each at most once (exactjson.Object), and
// returns its fields. It answers a body over the server's limit with 413
// too_large and any other problem with 400 bad_request, showing the body's
// shape, and returns false then.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, v any, keys []string, shape string) (map[string]json.RawMessage, bool) {
	// Read to EOF, so that the server watches the connection from here on
	// and a client that goes away is noticed at once.
	raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	var fields map[string]json.RawMessage
	if err == nil {
		fields, err = exactjson.Object(raw, keys)
	}
	if err == nil {
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.DisallowUnknownFields()
		err = dec.Decode(v)
	}
	var tooBig *http.MaxBytesError
	var wrongType *json.UnmarshalTypeError
	switch {
	case errors.As(err, &tooBig):
		writeError(w, http.StatusRequestEntityTooLarge, "too_large", fmt.Sprintf("the request body is over the server's limit of %d bytes", s.cfg.MaxBodyBytes))
		return nil, false
	case errors.As(err, &wrongType) && wrongType.Field != "":
		// Said in JSON's words, not Go's ("cannot unmarshal number into
		// Go struct field TurnRequest.input of type string").
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("the body must be one JSON object %s: %q must be %s, not %s",
			shape, wrongType.Field, jsonKind(wrongType.Type), article(wrongType.Value)))
		return nil, false
	case err != nil:
		writeError(w, http.StatusBadRequest, "bad_request", fmt.Sprintf("the body must be one JSON object %s: %s", shape, shown(err.Error())))
		return nil, false
	}
	return fields, true
}

// queryParams returns the query parameters each route takes, by its
// pattern ("GET /v1/turns"), as the OpenAPI document declares them: the
// one list, which openapi_test.go keeps true.
func queryParams() map[string][]string {
	var doc struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		panic("server: openapi.json: " + err.Error())
	}
	out := map[string][]string{}
	for path, ops := range doc.Paths {
		for method, raw := range ops {
			var op struct {
				Parameters []struct{ Name, In string } `json:"parameters"`
			}
			if json.Unmarshal(raw, &op) != nil {
				continue // not an operation
			}
			var names []string
			for _, p := range op.Parameters {
				if p.In == "query" {
					names = append(names, p.Name)
				}
			}
			out[strings.ToUpper(method)+" "+path] = names
		}
	}
	return out
}

// onlyParams refuses a request to the route pattern with a query
// parameter it does not take (400): a misspelt filter
// (?sesion_id=…) would otherwise be ignored, and every turn listed, as an
// unknown key of a body is refused for the same reason.
func onlyParams(pattern string, names []string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery != "" {
			for k := range r.URL.Query() {
				if slices.Contains(names, k) {
					continue
				}
				msg := fmt.Sprintf("unknown query parameter %s: %s takes none", shown(strconv.Quote(k)), pattern)
				if len(names) > 0 {
					hint := ""
					if s := problem.Suggest(k, names); s != "" {
						hint = " (did you mean " + s + "?)"
					}
					msg = fmt.Sprintf("unknown query parameter %s%s: %s takes %s", shown(strconv.Quote(k)), hint, pattern, strings.Join(names, ", "))
				}
				writeError(w, http.StatusBadRequest, "bad_request", msg)
				return
			}
		}
		h(w, r)
	}
}

// jsonKind names, in JSON's words, the values that decode into t.
func jsonKind(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return jsonKind(t.Elem())
	}
	return "another value"
}

// article puts "a" or "an" before the kind of a JSON value as
// encoding/json names it ("number", "string", "array", "object", "bool").
func article(kind string) string {
	switch {
	case kind == "bool":
		return "true or false"
	case strings.HasPrefix(kind, "number "):
		return "the number " + strings.TrimPrefix(kind, "number ")
	case kind != "" && strings.IndexByte("aeiou", kind[0]) >= 0:
		return "an " + kind
	}
	return "a " + kind
}

// validText reports whether the JSON string raw, decoded as s, was valid
// UTF-8: encoding/json replaces an invalid byte, and a \u escape of half a
// surrogate pair, with U+FFFD without a word. Every U+FFFD of s must be
// one the client sent, as the character or as \ufffd.
func validText(raw json.RawMessage, s string) bool {
	if !utf8.Valid(raw) {
		return false
	}
	n := strings.Count(s, "\uFFFD")
	if n == 0 {
		return true
	}
	sent := bytes.Count(raw, []byte("\uFFFD")) + bytes.Count(bytes.ToLower(raw), []byte(`\ufffd`))
	return n <= sent
}

// wantsStream reports whether the request accepts text/event-stream: a
// media range of it (in any case) whose q is not 0.
func wantsStream(r *http.Request) bool {
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			typ, params, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err != nil || typ != "text/event-stream" {
				continue
			}
			if q, ok := params["q"]; ok {
				if f, err := strconv.ParseFloat(q, 64); err == nil && f == 0 {
					continue
				}
			}
			return true
		}
	}
	return false
}

func (s *Server) postTurn(w http.ResponseWriter, r *http.Request) {
	req, ok := s.readTurnRequest(w, r)
	if !ok {
		return
	}
	if !s.checkBudgets(w, req.Budgets) {
		return
	}
	if req.SessionID == "" {
		req.SessionID = newSessionID()
	}
	// A traceparent header makes the turn's span its child.
	ctx := agent.WithTraceParent(r.Context(), r.Header.Get("traceparent"))
	lt, sb, err := s.start(ctx, req.SessionID, req.Input, req.Budgets, req.Detach)
	switch {
	case errors.Is(err, errDraining):
		w.Header().Set("Retry-After", "5")
		writeError(w, http.StatusServiceUnavailable, "shutting_down", "the server is shutting down and starts no new turns")
		return
	case errors.Is(err, errBusy):
		writeError(w, http.StatusConflict, "session_busy", err.Error())
		return
	case errors.Is(err, errStoreAway):
		w.Header().Set("Retry-After", "5")
		s.failed(w, r, http.StatusServiceUnavailable, "store_unavailable",
			"the store cannot be reached for now (away, hung, or locked by another process), so the turn cannot begin; ask again shortly, or through another gateway", err)
		return
	case err != nil:
		s.failed(w, r, http.StatusInternalServerError, "store_error", "starting the turn failed", err)
		return
	}
	h := w.Header()
	h.Set(HeaderTurnID, lt.id)
	h.Set(HeaderSessionID, lt.session)
	h.Set("Location", "/v1/turns/"+lt.id)

	if wantsStream(r) {
		end := s.stream(w, r, lt, 0, sb)
		if end == endClientGone && !req.Detach {
			s.cancelTurn(lt, &budget.CancelError{Reason: budget.ClientGone, By: "the client"})
		}
		return
	}
	lt.hub.unsubscribe(sb)
	if req.Detach {
		writeJSON(w, http.StatusAccepted, TurnAccepted{TurnID: lt.id, SessionID: lt.session, Status: budget.StatusRunning,
			Events: "/v1/turns/" + lt.id + "/events"})
		return
	}
	// Name the turn at once, then wait for its record.
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	http.NewResponseController(w).Flush()
	select {
	case <-lt.ended:
		lt.storedOrLater()
		_ = writeRecord(w, lt.record(s))
	case <-r.Context().Done():
		s.cancelTurn(lt, &budget.CancelError{Reason: budget.ClientGone, By: "the client"})
	}
}

// checkBudgets answers 400 for budgets the agent refuses, naming the
// budget, the value asked and the ceiling.
func (s *Server) checkBudgets(w http.ResponseWriter, req budget.Request) bool {
	bc, ok := s.cfg.Agent.(BudgetChecker)
	if len(req) == 0 || !ok {
		return true
	}
	_, _, err := bc.TurnBudgets(req)
	if err == nil {
		return true
	}
	writeError(w, http.StatusBadRequest, "bad_budget", err.Error(), func(b *errorBody) {
		var re *budget.RequestError
		if errors.As(err, &re) {
			b.Error.Key, b.Error.Asked, b.Error.Ceiling = re.Name, shown(re.Asked), re.Ceiling
		}
	})
	return false
}

func (s *Server) getTurn(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	rec, err := s.cfg.Store.Turn(r.Context(), id)
	if err != nil {
		s.storeFailed(w, r, err, "turn "+shown(id))
		return
	}
	if v := r.URL.Query().Get("events"); v != "false" && v != "0" {
		if rec.Events, err = s.cfg.Store.Events(r.Context(), id, 0, 0); err != nil {
			s.storeFailed(w, r, err, "turn "+shown(id))
			return
		}
	}
	writeRecordJSON(w, http.StatusOK, rec)
}

// TurnList is the response of GET /v1/turns.
type TurnList struct {
	// Turns are the turns that match, newest first.
	Turns []store.TurnSummary `json:"turns"`
	// NextBefore, when set, is the "before" value that gets the next page.
	NextBefore string `json:"next_before,omitempty"`
}

func oneOf[T ~string](v string, valid []T) bool {
	for _, x := range valid {
		if string(x) == v {
			return true
		}
	}
	return false
}

func joined[T ~string](valid []T) string {
	s := make([]string, len(valid))
	for i, x := range valid {
		s[i] = string(x)
	}
	return strings.Join(s, ", ")
}

func parseLimit(v string) (int, error) {
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > store.MaxLimit {
		return 0, fmt.Errorf(`"limit" must be a number from 1 to %d`, store.MaxLimit)
	}
	return n, nil
}

func (s *Server) listTurns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := store.Filter{Status: budget.Status(q.Get("status")), StopReason: budget.StopReason(q.Get("stop_reason")),
		SessionID: q.Get("session_id"), Before: q.Get("before")}
	if err := f.Check(`"status"`, `"stop_reason"`); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	var err error
	if f.Limit, err = parseLimit(q.Get("limit")); err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	turns, err := s.cfg.Store.Turns(r.Context(), f)
	if err != nil {
		what := "the list of turns"
		if errors.Is(err, store.ErrNotFound) {
			what = "turn " + shown(f.Before) // the page's "before"
		}
		s.storeFailed(w, r, err, what)
		return
	}
	out := TurnList{Turns: turns}
	if len(turns) == store.ClampLimit(f.Limit) {
		out.NextBefore = turns[len(turns)-1].TurnID
	}
	writeJSON(w, http.StatusOK, out)
}

// cancelWait is how long POST /v1/turns/{id}/cancel waits for the turn to
// end before it answers 202 instead of the record.
const cancelWait = 10 * time.Second

func (s *Server) cancel(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	lt := s.live(id)
	if lt == nil {
		s.cancelElsewhere(w, r, id)
		return
	}
	s.cancelTurn(lt, &budget.CancelError{Reason: budget.Cancelled})
	t := time.NewTimer(cancelWait)
	defer t.Stop()
	select {
	case <-lt.ended:
		lt.storedOrLater()
		writeRecordJSON(w, http.StatusOK, lt.record(s))
	case <-t.C:
		writeJSON(w, http.StatusAccepted, TurnAccepted{TurnID: id, SessionID: lt.session, Status: budget.StatusRunning,
			Events: "/v1/turns/" + id + "/events"})
	case <-r.Context().Done():
	}
}

// cancelElsewhere cancels a turn this server does not run: the store
// carries the request to the gateway that runs it (PostgreSQL), or says it
// cannot (SQLite: another process on this machine). Like a local cancel, it
// answers with the turn's record once it has ended, or 202 after
// cancelWait.
func (s *Server) cancelElsewhere(w http.ResponseWriter, r *http.Request, id string) {
	// Watching before the request, so that the end is not missed.
	changed, unwatch := s.cfg.Store.Watch(id)
	defer unwatch()
	err := s.cfg.Store.RequestCancel(r.Context(), id)
	switch {
	case errors.Is(err, store.ErrNotHere):
		writeError(w, http.StatusConflict, "not_here", fmt.Sprintf("turn %s is running in another timebox process that does not share this store's cancel requests; cancel it there", shown(id)))
		return
	case errors.Is(err, store.ErrNotRunning):
		rec, err := s.cfg.Store.Turn(r.Context(), id)
		if err != nil {
			s.storeFailed(w, r, err, "turn "+shown(id))
			return
		}
		writeError(w, http.StatusConflict, "already_ended", fmt.Sprintf("turn %s already ended: %s (%s)", shown(id), rec.Status, rec.StopReason))
		return
	case err != nil:
		s.storeFailed(w, r, err, "turn "+shown(id))
		return
	}
	// An engine's turn is told through the engine too: the store's
	// request reaches its workflow only through a worker, and a turn
	// whose gateway is gone may have none.
	ec, engine := s.cfg.Agent.(EngineCanceller)
	if engine {
		ec.CancelTurn(r.Context(), id, &budget.CancelError{Reason: budget.Cancelled, By: "a client"})
	}
	t := time.NewTimer(cancelWait)
	defer t.Stop()
	for {
		rec, err := s.cfg.Store.Turn(r.Context(), id)
		if err != nil {
			s.storeFailed(w, r, err, "turn "+shown(id))
			return
		}
		if rec.Status != budget.StatusRunning {
			writeJSON(w, http.StatusOK, rec)
			return
		}
		select {
		case <-changed:
		case <-t.C:
			if engine {
				// Still running: ended here if no worker will end it.
				engine = false
				if ended, err := ec.EndUnworked(r.Context(), id, cancelWait); ended {
					continue
				} else if err != nil {
					s.log.Warn("ending a cancelled turn no worker runs", "turn_id", id, "err", err)
				}
			}
			writeJSON(w, http.StatusAccepted, TurnAccepted{TurnID: id, SessionID: rec.SessionID, Status: budget.StatusRunning,
				Events: "/v1/turns/" + id + "/events"})
			return
		case <-r.Context().Done():
			return
		}
	}
}

// SessionList is the response of GET /v1/sessions.
type SessionList struct {
	// Sessions are the sessions, most recently active first.
	Sessions []store.SessionSummary `json:"sessions"`
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request) {
	limit, err := parseLimit(r.URL.Query().Get("limit"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	list, err := s.cfg.Store.Sessions(r.Context(), limit)
	if err != nil {
		s.storeFailed(w, r, err, "sessions")
		return
	}
	writeJSON(w, http.StatusOK, SessionList{Sessions: list})
}

func (s *Server) getSession(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	sess, err := s.cfg.Store.Session(r.Context(), id)
	if err != nil {
		s.storeFailed(w, r, err, "session "+shown(id))
		return
	}
	writeJSON(w, http.StatusOK, sess)
}

// eventsAfter reads where a follower resumes: Last-Event-ID, else ?after=.
func eventsAfter(r *http.Request) (int64, error) {
	v := r.Header.Get("Last-Event-ID")
	what := "Last-Event-ID"
	if v == "" {
		v, what = r.URL.Query().Get("after"), `"after"`
	}
	if v == "" {
		return 0, nil
	}
	// Digits only: no sign ("-0", "+3"), no spaces.
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || strings.Trim(v, "0123456789") != "" {
		return 0, fmt.Errorf("%s must be an event seq (a whole number ≥ 0), not %s", what, shown(strconv.Quote(v)))
	}
	return n, nil
}

func (s *Server) getEvents(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	after, err := eventsAfter(r)
	if err != nil {
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		return
	}
	lt := s.live(id)
	if lt == nil {
		// Not running here: it ended, or runs in another process. An ended
		// turn with nothing after `after` is answered 204, which tells an
		// EventSource to stop reconnecting.
		rec, err := s.cfg.Store.Turn(r.Context(), id)
		if err != nil {
			s.storeFailed(w, r, err, "turn "+shown(id))
			return
		}
		if rec.Status != budget.StatusRunning {
			evs, err := s.cfg.Store.Events(r.Context(), id, after, 1)
			if err != nil {
				s.storeFailed(w, r, err, "turn "+shown(id))
				return
			}
			if len(evs) == 0 {
				w.WriteHeader(http.StatusNoContent)
				return
			}
		}
	}
	w.Header().Set(HeaderTurnID, id)
	if r.Method == http.MethodHead {
		// The headers a GET would get, and no stream: a HEAD that
		// followed the turn held its connection (and a client's pool)
		// until the turn ended.
		sseHeaders(w.Header())
		w.WriteHeader(http.StatusOK)
		return
	}
	s.stream(w, r, lt, after, nil)
}
