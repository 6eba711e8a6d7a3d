package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"mime"
	"net/http/httptest"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/advice"
	"github.com/timebox-run/timebox/internal/doctest"
	"github.com/timebox-run/timebox/server"
	"github.com/timebox-run/timebox/store"
)

// These tests keep openapi.json (served at /v1/openapi.json, and the
// reference docs/http-api.md guides through) true to the server: its
// routes are the mux's, each status it documents is produced here with the
// body it documents, its schemas have the fields of the Go types they
// describe, and its enumerations are the code's.

// apiDoc is the OpenAPI document as a tree.
type apiDoc struct {
	Paths      map[string]map[string]apiOp `json:"paths"`
	Components struct {
		Responses map[string]apiResponse    `json:"responses"`
		Schemas   map[string]map[string]any `json:"schemas"`
	} `json:"components"`
}

type apiOp struct {
	Summary    string                 `json:"summary"`
	Parameters []apiParam             `json:"parameters"`
	Responses  map[string]apiResponse `json:"responses"`
}

type apiParam struct {
	Name        string         `json:"name"`
	In          string         `json:"in"`
	Description string         `json:"description"`
	Schema      map[string]any `json:"schema"`
}

type apiResponse struct {
	Ref     string                    `json:"$ref"`
	Content map[string]map[string]any `json:"content"`
}

func loadAPIDoc(t *testing.T) apiDoc {
	t.Helper()
	var d apiDoc
	if err := json.Unmarshal(server.OpenAPI(), &d); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	return d
}

// operation is "METHOD /path" as the document writes it.
type operation string

func (d apiDoc) operations() map[operation]apiOp {
	out := map[operation]apiOp{}
	for path, ops := range d.Paths {
		for method, op := range ops {
			out[operation(strings.ToUpper(method)+" "+path)] = op
		}
	}
	return out
}

// response returns the documented response of op for status, with a
// component reference followed, and its JSON pointer in the document.
func (d apiDoc) response(op operation, status int) (apiResponse, string, bool) {
	method, path, _ := strings.Cut(string(op), " ")
	r, ok := d.Paths[path][strings.ToLower(method)].Responses[fmt.Sprint(status)]
	if !ok {
		return r, "", false
	}
	ptr := "/paths/" + escapePtr(path) + "/" + strings.ToLower(method) + "/responses/" + fmt.Sprint(status)
	if r.Ref != "" {
		name := strings.TrimPrefix(r.Ref, "#/components/responses/")
		r, ok = d.Components.Responses[name]
		ptr = "/components/responses/" + name
	}
	return r, ptr, ok
}

func escapePtr(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

// catchAll is the mux pattern that answers every other /v1 path (404, or
// 405 for a known path and a wrong method); the document describes it in
// its introduction, and its statuses are checked with the routes'.
const catchAll = "/v1/"

// TestOpenAPIRoutes: every pattern the mux registers (read from routes()'s
// source) is an operation of the document, and the other way round.
func TestOpenAPIRoutes(t *testing.T) {
	var patterns []string
	for _, fn := range []string{"api", "Handle"} {
		ps, err := doctest.Calls(".", fn, 0)
		if err != nil {
			t.Fatal(err)
		}
		patterns = append(patterns, ps...)
	}
	mux := map[operation]bool{}
	for _, p := range patterns {
		switch {
		case p == catchAll:
		case p == "/": // the page: its handler allows GET and HEAD
			mux["GET /"] = true
		case strings.Contains(p, " "):
			mux[operation(p)] = true
		default:
			t.Errorf("the mux pattern %q has no method; say in this test how the document describes it", p)
		}
	}
	doc := loadAPIDoc(t).operations()
	for op := range mux {
		if _, ok := doc[op]; !ok {
			t.Errorf("the server routes %s, which openapi.json does not document", op)
		}
	}
	for op := range doc {
		if !mux[op] {
			t.Errorf("openapi.json documents %s, which the server does not route", op)
		}
	}
	if len(mux) < 10 {
		t.Errorf("only %d routes found in routes(): %v", len(mux), patterns)
	}
}

// jsonFields returns the JSON names of a struct's fields, embedded
// structs' included.
func jsonFields(t reflect.Type) []string {
	var out []string
	for f := range t.Fields() {
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" {
			out = append(out, jsonFields(f.Type)...)
			continue
		}
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, name)
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// TestOpenAPISchemasMatchTheTypes: each schema of the document lists
// exactly the JSON fields of the Go type it describes, so that a field
// added to a request or a record fails here until it is documented.
func TestOpenAPISchemasMatchTheTypes(t *testing.T) {
	d := loadAPIDoc(t)
	types := map[string]reflect.Type{
		"TurnRequest":     reflect.TypeFor[server.TurnRequest](),
		"TurnAccepted":    reflect.TypeFor[server.TurnAccepted](),
		"TurnList":        reflect.TypeFor[server.TurnList](),
		"SessionList":     reflect.TypeFor[server.SessionList](),
		"Turn":            reflect.TypeFor[event.Turn](),
		"ToolCall":        reflect.TypeFor[event.ToolCall](),
		"ModelCall":       reflect.TypeFor[event.ModelCall](),
		"Flags":           reflect.TypeFor[event.Flags](),
		"TurnSummary":     reflect.TypeFor[store.TurnSummary](),
		"SessionSummary":  reflect.TypeFor[store.SessionSummary](),
		"Session":         reflect.TypeFor[store.Session](),
		"Message":         reflect.TypeFor[store.Message](),
		"Error":           reflect.TypeFor[apiError](),
		"StatsReport":     reflect.TypeFor[server.StatsReport](),
		"ToolStats":       reflect.TypeFor[server.ToolStats](),
		"Histogram":       reflect.TypeFor[server.Histogram](),
		"ModelStats":      reflect.TypeFor[advice.Model](),
		"Approval":        reflect.TypeFor[store.Approval](),
		"ApprovalNote":    reflect.TypeFor[event.Approval](),
		"ApprovalList":    reflect.TypeFor[server.ApprovalList](),
		"DecisionRequest": reflect.TypeFor[server.DecisionRequest](),
		"DeliveryList":    reflect.TypeFor[server.DeliveryList](),
		"Delivery":        reflect.TypeFor[store.Delivery](),
		"DeliveryAttempt": reflect.TypeFor[store.DeliveryAttempt](),
	}
	for name, schema := range d.Components.Schemas {
		typ, ok := types[name]
		if !ok {
			if name != "Event" && name != "Health" { // the event header and healthz's map are checked by their bodies
				t.Errorf("the schema %s describes no Go type this test knows: add it to the table", name)
			}
			continue
		}
		props, _ := schema["properties"].(map[string]any)
		got := slices.Sorted(maps.Keys(props))
		if want := jsonFields(typ); !slices.Equal(got, want) {
			t.Errorf("openapi.json's %s has the properties %q; %s has the fields %q", name, got, typ, want)
		}
	}
	for name := range types {
		if _, ok := d.Components.Schemas[name]; !ok {
			t.Errorf("openapi.json has no schema %s", name)
		}
	}
}

// enumOf returns the enum at a path of keys in a schema.
func enumOf(t *testing.T, schema map[string]any, keys ...string) []string {
	t.Helper()
	var v any = schema
	for _, k := range keys {
		m, _ := v.(map[string]any)
		v = m[k]
	}
	list, _ := v.([]any)
	var out []string
	for _, x := range list {
		if s, _ := x.(string); s != "" {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		t.Fatalf("no enum at %v", keys)
	}
	sort.Strings(out)
	return out
}

// paramEnum returns the enum of a query parameter of GET /v1/turns.
func paramEnum(t *testing.T, d apiDoc, name string) []string {
	t.Helper()
	for _, p := range d.Paths["/v1/turns"]["get"].Parameters {
		if p.Name == name {
			return enumOf(t, p.Schema, "enum")
		}
	}
	t.Fatalf("GET /v1/turns has no parameter %s", name)
	return nil
}

func consts(t *testing.T, dir, typ string) []string {
	t.Helper()
	vs, err := doctest.Consts(dir, typ)
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(vs)
	return slices.Compact(vs)
}

// TestOpenAPIEnums: the values the document lists are the code's: every
// error code the handlers write, every event type, status, stop reason,
// outcome and phase.
func TestOpenAPIEnums(t *testing.T) {
	d := loadAPIDoc(t)
	s := d.Components.Schemas
	codes := errorCodes(t)
	for _, c := range []struct {
		what string
		got  []string
		want []string
	}{
		{"Error.error.code", enumOf(t, s["Error"], "properties", "error", "properties", "code", "enum"), codes},
		{"Event.type", enumOf(t, s["Event"], "properties", "type", "enum"), consts(t, "../event", "Type")},
		{"Turn.status", enumOf(t, s["Turn"], "properties", "status", "enum"), consts(t, "../budget", "Status")},
		{"Turn.stop_reason", enumOf(t, s["Turn"], "properties", "stop_reason", "enum"), consts(t, "../budget", "StopReason")},
		{"TurnSummary.stop_reason", enumOf(t, s["TurnSummary"], "properties", "stop_reason", "enum"), consts(t, "../budget", "StopReason")},
		{"ToolCall.outcome", enumOf(t, s["ToolCall"], "properties", "outcome", "enum"), consts(t, "../event", "Outcome")},
		{"ModelCall.phase", enumOf(t, s["ModelCall"], "properties", "phase", "enum"), consts(t, "../budget", "Phase")},
		{"ToolCall.enforcement", enumOf(t, s["ToolCall"], "properties", "enforcement", "enum"), consts(t, "../budget", "Enforcement")},
		{"the status filter", paramEnum(t, d, "status"), consts(t, "../budget", "Status")},
		{"the stop_reason filter", paramEnum(t, d, "stop_reason"), consts(t, "../budget", "StopReason")},
		{"Delivery.state", enumOf(t, s["Delivery"], "properties", "state", "enum"), consts(t, "../store", "DeliveryState")},
	} {
		if !slices.Equal(c.got, c.want) {
			t.Errorf("openapi.json's %s lists %q; the code has %q", c.what, c.got, c.want)
		}
	}
}

// validator compiles schemas at pointers of the document.
type validator struct {
	c     *jsonschema.Compiler
	cache map[string]*jsonschema.Schema
}

func newValidator(t *testing.T) *validator {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(server.OpenAPI()))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	if err := c.AddResource("openapi.json", doc); err != nil {
		t.Fatal(err)
	}
	return &validator{c: c, cache: map[string]*jsonschema.Schema{}}
}

func (v *validator) validate(t *testing.T, ptr string, body []byte) {
	t.Helper()
	s, ok := v.cache[ptr]
	if !ok {
		var err error
		if s, err = v.c.Compile("openapi.json#" + ptr); err != nil {
			t.Fatalf("compiling the schema at %s: %v", ptr, err)
		}
		v.cache[ptr] = s
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	if err != nil {
		t.Errorf("the body is not JSON (%v): %.300s", err, body)
		return
	}
	if err := s.Validate(inst); err != nil {
		t.Errorf("the body does not match the schema at %s: %v\n%.600s", ptr, err, body)
	}
}

// unreachableStore is a database server's store that does not answer.
type unreachableStore struct{ store.Store }

func (unreachableStore) Ping(context.Context) error { return errDisk }

// behindStore cannot store events now: it keeps 3 (store.Backlogged).
type behindStore struct{ store.Store }

func (behindStore) Backlog() store.Backlog {
	return store.Backlog{Events: 3, Bytes: 120, Since: time.Now().Add(-time.Second), Err: "connection refused"}
}

// awayStore cannot be written for now (its database is away).
type awayStore struct{ store.Store }

func (awayStore) BeginTurn(context.Context, store.TurnStart) error {
	return fmt.Errorf("%w: connection refused", store.ErrUnavailable)
}

// failingStore is a store whose reads, BeginTurn and RequestCancel fail,
// for the 500s; with away, as a database that cannot be reached fails
// them (store.ErrUnavailable), for the 503s.
type failingStore struct {
	store.Store
	away bool
}

var errDisk = errors.New("disk I/O error")

// errAway is a read of a database that cannot be reached.
var errAway = fmt.Errorf("%w: dial tcp 127.0.0.1:5432: connect: connection refused", store.ErrUnavailable)

func (f failingStore) err() error {
	if f.away {
		return errAway
	}
	return errDisk
}

func (f failingStore) BeginTurn(context.Context, store.TurnStart) error  { return f.err() }
func (f failingStore) Turn(context.Context, string) (*event.Turn, error) { return nil, f.err() }
func (f failingStore) RequestCancel(context.Context, string) error       { return f.err() }
func (f failingStore) Turns(context.Context, store.Filter) ([]store.TurnSummary, error) {
	return nil, f.err()
}
func (f failingStore) Events(context.Context, string, int64, int) ([]event.Event, error) {
	return nil, f.err()
}
func (f failingStore) Session(context.Context, string) (*store.Session, error) { return nil, f.err() }
func (f failingStore) Sessions(context.Context, int) ([]store.SessionSummary, error) {
	return nil, f.err()
}

func (f failingStore) RequestApproval(context.Context, store.Approval) error { return f.err() }
func (f failingStore) Decide(context.Context, string, string, store.Approval) (store.Approval, error) {
	return store.Approval{}, f.err()
}
func (f failingStore) Approval(context.Context, string, string) (store.Approval, error) {
	return store.Approval{}, f.err()
}
func (f failingStore) Approvals(context.Context, string) ([]store.Approval, error) {
	return nil, f.err()
}

// failingDeliveries keeps deliveries it cannot list.
type failingDeliveries struct {
	*store.Memory
	away bool
}

func (f failingDeliveries) ListDeliveries(context.Context, store.DeliveryFilter) ([]store.Delivery, error) {
	return nil, failingStore{away: f.away}.err()
}

// statsStore sums up canned calls (store.CallStats), for GET /v1/stats's
// 200; with fail, its reads fail, for the 500, and with away too, as a
// database that cannot be reached fails them, for the 503.
type statsStore struct {
	store.Store
	fail, away bool
}

func (s statsStore) ToolStats(context.Context, store.StatsFilter) ([]store.ToolStat, error) {
	if s.fail {
		return nil, failingStore{away: s.away}.err()
	}
	return []store.ToolStat{{Tool: "fetch", Calls: 30, Sample: 30, P50MS: 40, P95MS: 300, P99MS: 900, MaxMS: 900, MinMS: 5,
		MaxOKMS: 900, TimedOut: 1, TimeoutMS: 1000}}, nil
}

func (s statsStore) ModelStats(context.Context, store.StatsFilter) ([]store.ModelStat, error) {
	return []store.ModelStat{{Endpoint: "script:m", Phase: budget.PhaseLLMFirstChunk, Calls: 3, Sample: 3, P50MS: 10, P95MS: 20,
		P99MS: 20, MaxMS: 20, MaxOKMS: 20}}, nil
}

func (s statsStore) ToolHistogram(_ context.Context, _ store.StatsFilter, _ string, bounds []int64) ([]int64, error) {
	counts := make([]int64, len(bounds)+1)
	counts[0], counts[len(bounds)] = 29, 1
	return counts, nil
}

// stubborn is a Runner whose turns ignore their cancellation until
// released, for the cancel route's 202.
type stubborn struct{ release chan struct{} }

func (s stubborn) Run(ctx context.Context, in agent.Input, sinks ...event.Sink) *agent.Result {
	em := event.NewEmitter(in.TurnID, sinks...)
	em.Emit(&event.TurnStarted{Input: in.Text, Model: "script:m"})
	<-s.release
	em.Emit(&event.TurnFinished{Status: budget.StatusCancelled, StopReason: budget.Cancelled, Message: "Cancelled."})
	em.Close()
	return &agent.Result{Record: &event.Turn{TurnID: in.TurnID, SessionID: in.SessionID, Input: in.Text,
		Status: budget.StatusCancelled, StopReason: budget.Cancelled, Message: "Cancelled.", Events: em.Log()}}
}

// exchange is one request and what it must get.
type exchange struct {
	name   string
	srv    *server.Server
	op     operation // documented operation, or catchAll
	method string
	path   string
	body   string
	hdr    []string
	status int
}

func serve(srv *server.Server, method, path, body string, hdr ...string) *httptest.ResponseRecorder {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, rd)
	req.Host = "127.0.0.1:8080"
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
			continue
		}
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, req)
	return rec
}

// TestOpenAPIStatuses makes, against a server, a request for every status
// of every operation the document lists, and checks that the server
// answers that status with the documented content type and a body that
// matches the documented schema; no documented status may be left
// unproduced, and the server may answer none the document does not list.
// It runs in synthetic time (the cancel route's 202 comes after 10s).
func TestOpenAPIStatuses(t *testing.T) {
	doc := loadAPIDoc(t)
	v := newValidator(t)
	produced := map[string]bool{}
	synctest.Test(t, func(t *testing.T) {
		newServer := func(cfg server.Config) *server.Server {
			if cfg.Store == nil {
				cfg.Store = store.NewMemory()
			}
			if cfg.Agent == nil {
				cfg.Agent = newAgent(t, scripted(t, `{"text": "hello"}`))
			}
			srv, err := server.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Shutdown(context.Background()); cfg.Store.Close() })
			return srv
		}
		quickStore := store.NewMemory()
		quick := newServer(server.Config{Store: quickStore, MaxInputBytes: 100, MaxBodyBytes: 1000})
		gated := newGate("wait")
		busy := newServer(server.Config{Agent: newAgent(t, scripted(t, waitThenAnswer...), gated.tool())})
		release := make(chan struct{})
		stuck := newServer(server.Config{Agent: stubborn{release: release}})
		broken := newServer(server.Config{Store: failingStore{Store: store.NewMemory()}})
		readsAway := newServer(server.Config{Store: failingStore{Store: store.NewMemory(), away: true}})
		unreachable := newServer(server.Config{Store: unreachableStore{store.NewMemory()}})
		behind := newServer(server.Config{Store: behindStore{store.NewMemory()}})
		away := newServer(server.Config{Store: awayStore{store.NewMemory()}})
		withToken := newServer(server.Config{Token: "docs-token-0123456789abcdef"})
		stats := newServer(server.Config{Store: statsStore{Store: store.NewMemory()}})
		statsFail := newServer(server.Config{Store: statsStore{Store: store.NewMemory(), fail: true}})
		statsAway := newServer(server.Config{Store: statsStore{Store: store.NewMemory(), fail: true, away: true}})
		hooked := store.NewMemory()
		if err := hooked.EnqueueDeliveries(context.Background(), []store.Delivery{{ID: "msg_1", URL: "https://hooks.example/x",
			EventType: "turn_finished", TurnID: "t_1", Seq: 9, Body: []byte("{}"), CreatedAt: time.Now(), NextAttemptAt: time.Now()}}); err != nil {
			t.Fatal(err)
		}
		withDeliveries := newServer(server.Config{Store: hooked})
		deliveriesFail := newServer(server.Config{Store: failingDeliveries{Memory: store.NewMemory()}})
		deliveriesAway := newServer(server.Config{Store: failingDeliveries{Memory: store.NewMemory(), away: true}})
		draining := newServer(server.Config{})
		if err := draining.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}

		// Turns to read: one that ended, in session s1; one running in
		// busy's session s2; one another process runs (only in the store).
		first := serve(quick, "POST", "/v1/turns", `{"input": "hi", "session_id": "s1"}`)
		done := first.Header().Get(server.HeaderTurnID)
		var ended event.Turn
		json.Unmarshal(first.Body.Bytes(), &ended)
		lastSeq := ended.Events[len(ended.Events)-1].Seq
		running := serve(busy, "POST", "/v1/turns", `{"input": "wait", "session_id": "s2", "detach": true}`).Header().Get(server.HeaderTurnID)
		<-gated.started
		if err := quickStore.BeginTurn(context.Background(), store.TurnStart{TurnID: "t_elsewhere", Input: "x", StartedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
		// A call waiting for a decision here, and one waiting in another
		// process (only in the store).
		asking := newServer(server.Config{Agent: newAgent(t, scripted(t, deployThenAnswer...), deployTool(0))})
		waiting := serve(asking, "POST", "/v1/turns", `{"input": "deploy", "detach": true}`).Header().Get(server.HeaderTurnID)
		synctest.Wait()
		if err := quickStore.RequestApproval(context.Background(), store.Approval{TurnID: "t_elsewhere", CallID: "call_1_1", Round: 1,
			Tool: "deploy", RequestedAt: time.Now(), ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}

		const sse = "text/event-stream"
		cases := []exchange{
			{"turn with its record", quick, "POST /v1/turns", "POST", "/v1/turns", `{"input": "hello"}`, nil, 200},
			{"turn with its stream", quick, "POST /v1/turns", "POST", "/v1/turns", `{"input": "hello"}`, []string{"Accept", sse}, 200},
			{"detached turn", quick, "POST /v1/turns", "POST", "/v1/turns", `{"input": "hello", "detach": true}`, nil, 202},
			{"empty input", quick, "POST /v1/turns", "POST", "/v1/turns", `{"input": " "}`, nil, 400},
			{"unknown field", quick, "POST /v1/turns", "POST", "/v1/turns", `{"input": "x", "sesion_id": "s"}`, nil, 400},
			{"session busy", busy, "POST /v1/turns", "POST", "/v1/turns", `{"input": "again", "session_id": "s2"}`, nil, 409},
			{"input too long", quick, "POST /v1/turns", "POST", "/v1/turns", `{"input": "` + strings.Repeat("x", 101) + `"}`, nil, 413},
			{"store fails", broken, "POST /v1/turns", "POST", "/v1/turns", `{"input": "hello"}`, nil, 500},
			{"store away", away, "POST /v1/turns", "POST", "/v1/turns", `{"input": "hello"}`, nil, 503},
			{"shutting down", draining, "POST /v1/turns", "POST", "/v1/turns", `{"input": "hello"}`, nil, 503},

			{"list", quick, "GET /v1/turns", "GET", "/v1/turns?status=completed&limit=1", "", nil, 200},
			{"bad filter", quick, "GET /v1/turns", "GET", "/v1/turns?stop_reason=bored", "", nil, 400},
			{"before no turn", quick, "GET /v1/turns", "GET", "/v1/turns?before=t_nope", "", nil, 404},
			{"a misspelt filter", quick, "GET /v1/turns", "GET", "/v1/turns?sesion_id=s1", "", nil, 400},
			{"list store fails", broken, "GET /v1/turns", "GET", "/v1/turns", "", nil, 500},
			{"list store away", readsAway, "GET /v1/turns", "GET", "/v1/turns", "", nil, 503},

			{"record", quick, "GET /v1/turns/{id}", "GET", "/v1/turns/" + done, "", nil, 200},
			{"record without events", quick, "GET /v1/turns/{id}", "GET", "/v1/turns/" + done + "?events=false", "", nil, 200},
			{"no such turn", quick, "GET /v1/turns/{id}", "GET", "/v1/turns/t_nope", "", nil, 404},
			{"record, a parameter it does not take", quick, "GET /v1/turns/{id}", "GET", "/v1/turns/" + done + "?event=false", "", nil, 400},
			{"record store fails", broken, "GET /v1/turns/{id}", "GET", "/v1/turns/t_x", "", nil, 500},
			{"record store away", readsAway, "GET /v1/turns/{id}", "GET", "/v1/turns/t_x", "", nil, 503},

			{"replay", quick, "GET /v1/turns/{id}/events", "GET", "/v1/turns/" + done + "/events?after=1", "", nil, 200},
			{"nothing after", quick, "GET /v1/turns/{id}/events", "GET", "/v1/turns/" + done + "/events", "", []string{"Last-Event-ID", fmt.Sprint(lastSeq)}, 204},
			{"bad after", quick, "GET /v1/turns/{id}/events", "GET", "/v1/turns/" + done + "/events?after=x", "", nil, 400},
			{"events of no turn", quick, "GET /v1/turns/{id}/events", "GET", "/v1/turns/t_nope/events", "", nil, 404},
			{"events store fails", broken, "GET /v1/turns/{id}/events", "GET", "/v1/turns/t_x/events", "", nil, 500},
			{"events store away", readsAway, "GET /v1/turns/{id}/events", "GET", "/v1/turns/t_x/events", "", nil, 503},

			{"cancel ends it", busy, "POST /v1/turns/{id}/cancel", "POST", "/v1/turns/" + running + "/cancel", "", nil, 200},
			{"already ended", quick, "POST /v1/turns/{id}/cancel", "POST", "/v1/turns/" + done + "/cancel", "", nil, 409},
			{"runs elsewhere", quick, "POST /v1/turns/{id}/cancel", "POST", "/v1/turns/t_elsewhere/cancel", "", nil, 409},
			{"cancel no turn", quick, "POST /v1/turns/{id}/cancel", "POST", "/v1/turns/t_nope/cancel", "", nil, 404},
			{"cancel with a parameter", quick, "POST /v1/turns/{id}/cancel", "POST", "/v1/turns/" + done + "/cancel?reason=x", "", nil, 400},
			{"cancel store fails", broken, "POST /v1/turns/{id}/cancel", "POST", "/v1/turns/t_x/cancel", "", nil, 500},
			{"cancel store away", readsAway, "POST /v1/turns/{id}/cancel", "POST", "/v1/turns/t_x/cancel", "", nil, 503},

			{"approvals", quick, "GET /v1/turns/{id}/approvals", "GET", "/v1/turns/t_elsewhere/approvals", "", nil, 200},
			{"approvals of no turn", quick, "GET /v1/turns/{id}/approvals", "GET", "/v1/turns/t_nope/approvals", "", nil, 404},
			{"approvals with a parameter", quick, "GET /v1/turns/{id}/approvals", "GET", "/v1/turns/t_elsewhere/approvals?pending=1", "", nil, 400},
			{"approvals store fails", broken, "GET /v1/turns/{id}/approvals", "GET", "/v1/turns/t_x/approvals", "", nil, 500},
			{"approvals store away", readsAway, "GET /v1/turns/{id}/approvals", "GET", "/v1/turns/t_x/approvals", "", nil, 503},
			{"approve here", asking, "POST /v1/turns/{id}/approvals/{call_id}", "POST", "/v1/turns/" + waiting + "/approvals/call_1_1", `{"decision": "approve"}`, nil, 200},
			{"decided twice", asking, "POST /v1/turns/{id}/approvals/{call_id}", "POST", "/v1/turns/" + waiting + "/approvals/call_1_1", `{"decision": "deny"}`, nil, 409},
			{"deny elsewhere", quick, "POST /v1/turns/{id}/approvals/{call_id}", "POST", "/v1/turns/t_elsewhere/approvals/call_1_1", `{"decision": "deny", "reason": "no"}`, nil, 202},
			{"not a decision", quick, "POST /v1/turns/{id}/approvals/{call_id}", "POST", "/v1/turns/t_elsewhere/approvals/call_1_1", `{"decision": "perhaps"}`, nil, 400},
			{"decision too long", quick, "POST /v1/turns/{id}/approvals/{call_id}", "POST", "/v1/turns/t_elsewhere/approvals/call_1_1", `{"decision": "deny", "reason": "` + strings.Repeat("x", 1000) + `"}`, nil, 413},
			{"no such call", quick, "POST /v1/turns/{id}/approvals/{call_id}", "POST", "/v1/turns/t_elsewhere/approvals/call_9_9", `{"decision": "approve"}`, nil, 404},
			{"decide store fails", broken, "POST /v1/turns/{id}/approvals/{call_id}", "POST", "/v1/turns/t_x/approvals/call_1_1", `{"decision": "approve"}`, nil, 500},
			{"decide store away", readsAway, "POST /v1/turns/{id}/approvals/{call_id}", "POST", "/v1/turns/t_x/approvals/call_1_1", `{"decision": "approve"}`, nil, 503},

			{"sessions", quick, "GET /v1/sessions", "GET", "/v1/sessions?limit=10", "", nil, 200},
			{"bad limit", quick, "GET /v1/sessions", "GET", "/v1/sessions?limit=0", "", nil, 400},
			{"sessions store fails", broken, "GET /v1/sessions", "GET", "/v1/sessions", "", nil, 500},
			{"sessions store away", readsAway, "GET /v1/sessions", "GET", "/v1/sessions", "", nil, 503},

			{"session", quick, "GET /v1/sessions/{id}", "GET", "/v1/sessions/s1", "", nil, 200},
			{"no such session", quick, "GET /v1/sessions/{id}", "GET", "/v1/sessions/nope", "", nil, 404},
			{"session with a parameter", quick, "GET /v1/sessions/{id}", "GET", "/v1/sessions/s1?limit=1", "", nil, 400},
			{"session store fails", broken, "GET /v1/sessions/{id}", "GET", "/v1/sessions/s1", "", nil, 500},
			{"session store away", readsAway, "GET /v1/sessions/{id}", "GET", "/v1/sessions/s1", "", nil, 503},

			{"stats", stats, "GET /v1/stats", "GET", "/v1/stats?since=7d&tool=fetch", "", nil, 200},
			{"stats since when", stats, "GET /v1/stats", "GET", "/v1/stats?since=lately", "", nil, 400},
			{"stats store fails", statsFail, "GET /v1/stats", "GET", "/v1/stats", "", nil, 500},
			{"stats store away", statsAway, "GET /v1/stats", "GET", "/v1/stats", "", nil, 503},
			{"no stats in memory", quick, "GET /v1/stats", "GET", "/v1/stats", "", nil, 501},

			{"deliveries", withDeliveries, "GET /v1/webhooks/deliveries", "GET", "/v1/webhooks/deliveries?state=pending&turn_id=t_1&limit=5", "", nil, 200},
			{"bad delivery state", withDeliveries, "GET /v1/webhooks/deliveries", "GET", "/v1/webhooks/deliveries?state=lost", "", nil, 400},
			{"deliveries store fails", deliveriesFail, "GET /v1/webhooks/deliveries", "GET", "/v1/webhooks/deliveries", "", nil, 500},
			{"deliveries store away", deliveriesAway, "GET /v1/webhooks/deliveries", "GET", "/v1/webhooks/deliveries", "", nil, 503},

			{"the document", quick, "GET /v1/openapi.json", "GET", "/v1/openapi.json", "", nil, 200},
			{"the document with a parameter", quick, "GET /v1/openapi.json", "GET", "/v1/openapi.json?v=2", "", nil, 400},
			{"metrics", quick, "GET /metrics", "GET", "/metrics", "", nil, 200},
			{"healthy", quick, "GET /healthz", "GET", "/healthz", "", nil, 200},
			{"draining", draining, "GET /healthz", "GET", "/healthz", "", nil, 503},
			{"store unreachable", unreachable, "GET /healthz", "GET", "/healthz", "", nil, 503},
			{"store behind", behind, "GET /healthz", "GET", "/healthz", "", nil, 503},
			{"page", quick, "GET /", "GET", "/", "", nil, 200},
			{"page by POST", quick, "GET /", "POST", "/", "", nil, 405},

			{"no route", quick, catchAll, "GET", "/v1/nothing", "", nil, 404},
			{"wrong method", quick, catchAll, "DELETE", "/v1/turns", "", nil, 405},
			{"wrong method on the document", quick, catchAll, "POST", "/v1/openapi.json", "", nil, 405},
		}
		// Every operation refuses a request for another host when the
		// server has no token, and every /v1 one (and /metrics) a request
		// without the token when it has one.
		for op := range doc.operations() {
			method, path, _ := strings.Cut(string(op), " ")
			path = strings.NewReplacer("{id}", "t_x", "{call_id}", "call_1_1").Replace(path)
			cases = append(cases, exchange{"other host " + string(op), quick, op, method, path, "", []string{"Host", "timebox.example.org"}, 403})
			if strings.HasPrefix(path, "/v1/") || path == "/metrics" {
				cases = append(cases, exchange{"no token " + string(op), withToken, op, method, path, "", nil, 401})
			}
		}
		cases = append(cases, exchange{"cross-origin POST", quick, "POST /v1/turns", "POST", "/v1/turns", `{"input": "x"}`, []string{"Origin", "https://evil.example"}, 403})

		check := func(c exchange, rec *httptest.ResponseRecorder) {
			t.Helper()
			if rec.Code != c.status {
				t.Errorf("%s: %s %s answered %d, want %d: %.300s", c.name, c.method, c.path, rec.Code, c.status, rec.Body.String())
				return
			}
			produced[fmt.Sprintf("%s %d", c.op, c.status)] = true
			if c.op == catchAll {
				v.validate(t, "/components/schemas/Error", rec.Body.Bytes())
				return
			}
			resp, ptr, ok := doc.response(c.op, c.status)
			if !ok {
				t.Errorf("%s: %s answers %d, which openapi.json does not document", c.name, c.op, c.status)
				return
			}
			if len(resp.Content) == 0 {
				if rec.Body.Len() != 0 {
					t.Errorf("%s: %d has a body, which the document does not describe", c.name, c.status)
				}
				return
			}
			ct, _, _ := mime.ParseMediaType(rec.Header().Get("Content-Type"))
			if _, ok := resp.Content[ct]; !ok {
				t.Errorf("%s: %s %d answers %s; the document has %v", c.name, c.op, c.status, ct, slices.Collect(maps.Keys(resp.Content)))
				return
			}
			switch ct {
			case "application/json":
				v.validate(t, ptr+"/content/application~1json/schema", rec.Body.Bytes())
			case sse:
				evs := newSSE(rec.Body).all(t)
				if len(evs) == 0 {
					t.Errorf("%s: an empty event stream", c.name)
				}
				for _, ev := range evs {
					v.validate(t, "/components/schemas/Event", []byte(ev.data))
				}
			}
		}
		for _, c := range cases {
			check(c, serve(c.srv, c.method, c.path, c.body, c.hdr...))
		}

		// The cancel route answers 202 when the turn has not ended after
		// 10s: here a Runner that ignores its cancellation.
		stuckID := serve(stuck, "POST", "/v1/turns", `{"input": "x", "detach": true}`).Header().Get(server.HeaderTurnID)
		synctest.Wait()
		c := exchange{"cancel waits 10s", stuck, "POST /v1/turns/{id}/cancel", "POST", "/v1/turns/" + stuckID + "/cancel", "", nil, 202}
		start := time.Now()
		check(c, serve(c.srv, c.method, c.path, c.body))
		if waited := time.Since(start); waited != 10*time.Second {
			t.Errorf("the cancel route answered 202 after %s, not 10s", waited)
		}
		close(release)
		gated.open()
	})

	var missing []string
	for op, o := range doc.operations() {
		for status := range o.Responses {
			if key := fmt.Sprintf("%s %s", op, status); !produced[key] {
				missing = append(missing, key)
			}
		}
	}
	for _, s := range []int{404, 405} {
		if !produced[fmt.Sprintf("%s %d", catchAll, s)] {
			missing = append(missing, fmt.Sprintf("%s %d", catchAll, s))
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("openapi.json documents %s, which no request of this test produced: add one", m)
	}
}
