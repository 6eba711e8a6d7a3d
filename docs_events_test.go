package timebox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/doctest"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/script"
	"github.com/timebox-run/timebox/tool"
)

// docs/events.md documents every event type, every field of every event
// and record, and every value of the enumerations, with an example of each
// event taken from a real turn. These tests fail when the page misses a
// type, a field or a value the code has (or names one it does not), and
// when an example no longer matches what a turn emits;
// `go test . -run TestDocsEvents -update` rewrites the examples.

var update = flag.Bool("update", false, "rewrite the generated examples of docs/events.md")

const (
	eventsDoc   = "docs/events.md"
	regenEvents = "`go test . -run TestDocsEvents -update`"
)

// constValues returns the values of the string constants of type typ
// declared in the package in dir.
func constValues(t *testing.T, dir, typ string) []string {
	t.Helper()
	vs, err := doctest.Consts(dir, typ)
	if err != nil {
		t.Fatal(err)
	}
	return vs
}

// eventTypes are the event types the event package declares.
func eventTypes(t *testing.T) []event.Type {
	var out []event.Type
	for _, s := range constValues(t, "event", "Type") {
		out = append(out, event.Type(s))
	}
	return out
}

// payloadType returns the payload struct of an event type, as the event
// package decodes it.
func payloadType(t *testing.T, typ event.Type) reflect.Type {
	t.Helper()
	var e event.Event
	if err := json.Unmarshal([]byte(`{"type": "`+string(typ)+`"}`), &e); err != nil {
		t.Fatalf("%s: %v", typ, err)
	}
	if _, raw := e.Data.(json.RawMessage); raw || e.Data == nil {
		t.Fatalf("the event package decodes no payload for the type %s (add it to newData)", typ)
	}
	return reflect.TypeOf(e.Data).Elem()
}

// field is one JSON field of a struct.
type field struct {
	name string
	typ  reflect.Type
}

// ownFields returns the JSON fields of struct st that are not promoted
// from an embedded struct, and the embedded structs.
func ownFields(st reflect.Type) (own []field, embedded []reflect.Type) {
	for f := range st.Fields() {
		tag := f.Tag.Get("json")
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			embedded = append(embedded, f.Type)
			continue
		}
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if st == reflect.TypeFor[event.ToolFinished]() && name == "turn_id" && strings.Contains(opts, "omitempty") {
			continue // a shadow that keeps the record's turn_id out of the flat event
		}
		own = append(own, field{name: name, typ: f.Type})
	}
	return own, embedded
}

// structsIn lists the struct types a field's value holds (through
// pointers, slices and maps), other than times and raw JSON.
func structsIn(t reflect.Type) []reflect.Type {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Map {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct || t == reflect.TypeFor[time.Time]() {
		return nil
	}
	return []reflect.Type{t}
}

// section returns the text of the page under the heading (up to the next
// heading of the same or a higher level).
func section(page, heading string) (string, bool) {
	i := strings.Index(page, "\n"+heading+"\n")
	if i < 0 {
		return "", false
	}
	level := strings.Index(heading, " ")
	rest := page[i+len(heading)+2:]
	for j := 0; j < len(rest); {
		k := strings.Index(rest[j:], "\n#")
		if k < 0 {
			break
		}
		j += k + 1
		hashes := len(rest[j:]) - len(strings.TrimLeft(rest[j:], "#"))
		if hashes <= level {
			return rest[:j], true
		}
		j++
	}
	return rest, true
}

var rowRE = regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|")

// rows returns the field names of a section's table rows.
func rows(text string) map[string]bool {
	out := map[string]bool{}
	for _, m := range rowRE.FindAllStringSubmatch(text, -1) {
		out[m[1]] = true
	}
	return out
}

// recordSections maps every struct an event or a turn record holds to the
// heading of its table in docs/events.md.
var recordSections = map[reflect.Type]string{
	reflect.TypeFor[event.ToolCall]():          "### Tool call record",
	reflect.TypeFor[event.ModelCall]():         "### Model call record",
	reflect.TypeFor[event.Turn]():              "### Turn record",
	reflect.TypeFor[event.Flags]():             "### Flags",
	reflect.TypeFor[event.Totals]():            "### Totals",
	reflect.TypeFor[event.BudgetValue]():       "### Budget values",
	reflect.TypeFor[event.ToolBudgetSummary](): "### Tool budgets",
	reflect.TypeFor[event.SilentCall]():        "### Silent calls",
	reflect.TypeFor[event.Approval]():          "### Approval",
	reflect.TypeFor[event.Event]():             "## Every event",
}

var headerFields = map[string]bool{"seq": true, "turn_id": true, "type": true, "at": true}

// checkFields checks that the section documents exactly st's own fields
// (minus skip), links the record of every struct st embeds, and that every
// struct a field holds has its own section; it returns those structs.
func checkFields(t *testing.T, page, heading, text string, st reflect.Type, skip map[string]bool) []reflect.Type {
	t.Helper()
	own, embedded := ownFields(st)
	documented := rows(text)
	want := map[string]bool{}
	var nested []reflect.Type
	for _, f := range own {
		if skip[f.name] {
			continue
		}
		want[f.name] = true
		if !documented[f.name] {
			t.Errorf("%s: %s does not document the field %s (of %s)", eventsDoc, heading, f.name, st)
		}
		nested = append(nested, structsIn(f.typ)...)
	}
	for name := range documented {
		if !want[name] {
			t.Errorf("%s: %s documents %s, which %s does not have", eventsDoc, heading, name, st)
		}
	}
	for _, e := range embedded {
		h, ok := recordSections[e]
		if !ok {
			t.Errorf("%s embeds %s, which docs/events.md has no section for (add it to recordSections)", st, e)
			continue
		}
		anchor := "(#" + strings.ReplaceAll(strings.ToLower(strings.TrimPrefix(h, "### ")), " ", "-") + ")"
		if !strings.Contains(text, anchor) {
			t.Errorf("%s: %s must link the %s it carries: %s", eventsDoc, heading, strings.TrimPrefix(h, "### "), anchor)
		}
		nested = append(nested, e)
	}
	return nested
}

// TestDocsEventsFields: docs/events.md has a section for every event type
// of the event package, and documents every field of every event and
// record, and no field they do not have.
func TestDocsEventsFields(t *testing.T) {
	data, err := os.ReadFile(eventsDoc)
	if err != nil {
		t.Fatal(err)
	}
	page := string(data)
	hdr, ok := section(page, "## Every event")
	if !ok {
		t.Fatal("no section \"## Every event\"")
	}
	for name := range headerFields {
		if !rows(hdr)[name] {
			t.Errorf("%s: the header table lacks %s", eventsDoc, name)
		}
	}
	types, _ := section(page, "## Event types")
	todo := map[reflect.Type]bool{}
	for _, typ := range eventTypes(t) {
		if !strings.Contains(types, "| [`"+string(typ)+"`](#"+string(typ)+") |") {
			t.Errorf("%s: the table of event types lacks %s", eventsDoc, typ)
		}
		heading := "### `" + string(typ) + "`"
		text, ok := section(page, heading)
		if !ok {
			t.Errorf("%s has no section %s: every event type is documented", eventsDoc, heading)
			continue
		}
		if _, err := doctest.Get(text, "example "+string(typ)); err != nil {
			t.Errorf("%s: %s has no example: %v", eventsDoc, heading, err)
		}
		for _, st := range checkFields(t, page, heading, text, payloadType(t, typ), headerFields) {
			todo[st] = true
		}
	}
	todo[reflect.TypeFor[event.Turn]()] = true
	done := map[reflect.Type]bool{}
	for len(todo) > 0 {
		for st := range todo {
			delete(todo, st)
			if done[st] {
				continue
			}
			done[st] = true
			heading, ok := recordSections[st]
			if !ok {
				t.Errorf("%s holds a %s, which has no section in %s (add one and name it in recordSections)", eventsDoc, st, eventsDoc)
				continue
			}
			text, ok := section(page, heading)
			if !ok {
				t.Errorf("%s has no section %s", eventsDoc, heading)
				continue
			}
			for _, n := range checkFields(t, page, heading, text, st, nil) {
				todo[n] = true
			}
		}
	}
}

// TestDocsEventsValues: every status, stop reason, phase, outcome,
// enforcement and budget source the code declares is listed in
// docs/events.md.
func TestDocsEventsValues(t *testing.T) {
	data, err := os.ReadFile(eventsDoc)
	if err != nil {
		t.Fatal(err)
	}
	page := string(data)
	for _, c := range []struct{ dir, typ, heading string }{
		{"budget", "Status", "### `status`"},
		{"budget", "StopReason", "### `stop_reason`"},
		{"budget", "Phase", "### `phase`"},
		{"event", "Outcome", "### `outcome`"},
		{"budget", "Enforcement", "### `enforcement`"},
		{"budget", "Source", "### `source`"},
	} {
		text, ok := section(page, c.heading)
		if !ok {
			t.Errorf("%s has no section %s", eventsDoc, c.heading)
			continue
		}
		listed := rows(text)
		declared := map[string]bool{}
		for _, v := range constValues(t, c.dir, c.typ) {
			declared[v] = true
			if !listed[v] {
				t.Errorf("%s: %s does not list %s (a %s.%s)", eventsDoc, c.heading, v, c.dir, c.typ)
			}
		}
		for v := range listed {
			if !declared[v] {
				t.Errorf("%s: %s lists %s, which is no %s.%s", eventsDoc, c.heading, v, c.dir, c.typ)
			}
		}
	}
}

// collector keeps a turn's events.
type collector struct{ l []event.Event }

func (c *collector) Emit(e event.Event) { c.l = append(c.l, e) }

// demoTurn runs the demo agent, as `timebox run -f examples/demo/agent.yaml`
// does, and returns its record and events.
func demoTurn(t *testing.T) (*event.Turn, []event.Event) {
	t.Helper()
	proctest.AfterTest(t)
	a, err := timebox.Open(t.Context(), "examples/demo/agent.yaml", timebox.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var c collector
	res := a.Run(ctx, agent.Input{Text: "Tour the budgets"}, event.SinkFunc(func(e event.Event) { c.Emit(e) }))
	if res.Record.Status != budget.StatusCompleted {
		t.Fatalf("the demo turn ended %s: %s", res.Record.StopReason, res.Record.Message)
	}
	return res.Record, c.l
}

// scriptedTurns runs, in synthetic time, the events the demo does not
// produce: a failover, a compaction, a late result; and a turn stopped by
// its turn budget while a tool ran, for the flags. Its timings are exact.
func scriptedTurns(t *testing.T) (evs []event.Event, stopped *event.Turn) {
	t.Helper()
	synctest.Test(t, func(t *testing.T) {
		lines, err := script.Parse(strings.NewReader(`{"compaction": true, "text": "The user asked about four reports; each answer summarised one.", "first_chunk_delay": "800ms"}
{"error": {"status": 503, "message": "overloaded"}, "first_chunk_delay": "120ms"}
{"chunks": ["Checking ", "both."], "first_chunk_delay": "400ms", "tool_calls": [{"name": "lookup", "arguments": {"id": "r-5"}}, {"name": "build_report", "arguments": {}}]}
{"text": "The lookup did not answer in time; the report is ready.", "first_chunk_delay": "300ms"}`), "docs")
		if err != nil {
			t.Fatal(err)
		}
		p, err := script.New(lines)
		if err != nil {
			t.Fatal(err)
		}
		secs := func(d time.Duration, key string) budget.Duration {
			return budget.Duration{D: d, Source: budget.SourceTool, Knob: "tools[" + key + "].timeout"}
		}
		lookup := agent.Tool{
			Tool: tool.NewFunc("lookup", "Looks a record up in a slow service.", nil, func(ctx context.Context, _ json.RawMessage, _ tool.Progress) (any, error) {
				time.Sleep(3 * time.Second) // ignores ctx: abandoned, then returns late
				return `{"record": "r-5", "status": "archived"}`, nil
			}),
			Budget: budget.ToolBudget{Timeout: secs(time.Second, "lookup"), Enforcement: budget.Cooperative, KillGrace: budget.Duration{D: 500 * time.Millisecond}},
		}
		report := agent.Tool{
			Tool: tool.NewFunc("build_report", "Builds the report.", nil, func(ctx context.Context, _ json.RawMessage, pr tool.Progress) (any, error) {
				for i := 1; i <= 4; i++ {
					select {
					case <-time.After(time.Second):
					case <-ctx.Done():
						return nil, ctx.Err()
					}
					n, total := float64(i), 4.0
					pr.Report(tool.Report{Progress: &n, Total: &total, Message: fmt.Sprintf("section %d of 4", i)})
				}
				return "report ready: 4 sections", nil
			}),
			Budget: budget.ToolBudget{Timeout: secs(10*time.Second, "build_report"), Enforcement: budget.Cooperative, KillGrace: budget.Duration{D: time.Second}},
		}
		a, err := agent.New(agent.Config{Name: "docs", Instructions: "Answer briefly.",
			Models: []model.Endpoint{
				{Provider: p, ProviderName: "script", Model: "primary"},
				{Provider: p, ProviderName: "script", Model: "fallback"},
			},
			Tools: []agent.Tool{lookup, report}, CompactAt: 500})
		if err != nil {
			t.Fatal(err)
		}
		var history []model.Message
		for i := range 4 {
			history = append(history, model.Message{Role: model.RoleUser, Content: strings.Repeat("What does report "+strconv.Itoa(i+1)+" say? ", 20)},
				model.Message{Role: model.RoleAssistant, Content: strings.Repeat("It says the budget held. ", 30)})
		}
		var c collector
		res := a.Run(t.Context(), agent.Input{TurnID: "t_docs", SessionID: "s_docs", History: history, Text: "Look up r-5 and build the report."}, &c)
		if res.Record.Status != budget.StatusCompleted {
			t.Fatalf("the scripted turn ended %s: %s", res.Record.StopReason, res.Record.Message)
		}
		evs = c.l

		// A turn whose 2s budget ends while a tool runs.
		p2, _ := script.New([]script.Line{{ToolCalls: []script.Call{{Name: "build_report", Arguments: json.RawMessage(`{}`)}}}})
		b := budget.Defaults()
		b.Turn = budget.Duration{D: 2 * time.Second, Source: budget.SourceFile, Knob: budget.KeyTurn}
		a2, err := agent.New(agent.Config{Name: "docs", Models: []model.Endpoint{{Provider: p2, ProviderName: "script", Model: "primary"}},
			Tools: []agent.Tool{report}, Budgets: b})
		if err != nil {
			t.Fatal(err)
		}
		res2 := a2.Run(t.Context(), agent.Input{TurnID: "t_docs_stopped", Text: "Build the report."})
		if res2.Record.StopReason != budget.TurnTimeout {
			t.Fatalf("the stopped turn ended %s: %s", res2.Record.StopReason, res2.Record.Message)
		}
		stopped = res2.Record

		// A call that waits 40s for a person, who approves it.
		p3, _ := script.New([]script.Line{
			{ToolCalls: []script.Call{{Name: "deploy", Arguments: json.RawMessage(`{"env": "production"}`)}}},
			{Text: "Deployed."}})
		deploy := agent.Tool{
			Tool: tool.NewFunc("deploy", "Deploys the service.", nil, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
				return "deployed v42", nil
			}),
			Budget:        budget.ToolBudget{Timeout: secs(time.Minute, "deploy"), Enforcement: budget.Cooperative, KillGrace: budget.Duration{D: time.Second}},
			NeedsApproval: agent.ApprovalRequired,
		}
		a3, err := agent.New(agent.Config{Name: "docs", Models: []model.Endpoint{{Provider: p3, ProviderName: "script", Model: "primary"}},
			Tools: []agent.Tool{deploy}})
		if err != nil {
			t.Fatal(err)
		}
		approve := agent.ApproverFunc(func(ctx context.Context, req agent.ApprovalRequest) (agent.Decision, error) {
			time.Sleep(40 * time.Second)
			return agent.Decision{Decision: event.Approve, By: "alice", Reason: "release window is open"}, nil
		})
		var c3 collector
		res3 := a3.Run(t.Context(), agent.Input{TurnID: "t_docs_approval", Text: "Deploy to production.", Approver: approve}, &c3)
		if res3.Record.StopReason != budget.Answered {
			t.Fatalf("the approval turn ended %s: %s", res3.Record.StopReason, res3.Record.Message)
		}
		evs = append(evs, c3.l...)
	})
	return evs, stopped
}

// first returns the first event of the type for which ok holds.
func first(t *testing.T, evs []event.Event, typ event.Type, ok func(event.Event) bool) (event.Event, bool) {
	t.Helper()
	for _, e := range evs {
		if e.Type == typ && (ok == nil || ok(e)) {
			return e, true
		}
	}
	return event.Event{}, false
}

func toolIs(name string) func(event.Event) bool {
	return func(e event.Event) bool {
		switch d := e.Data.(type) {
		case *event.ToolStarted:
			return d.Tool == name
		case *event.ToolProgress:
			return d.Tool == name
		case *event.ToolFinished:
			return d.Tool == name
		case *event.StillWorking:
			for _, c := range d.Calls {
				if c.Tool == name {
					return true
				}
			}
		}
		return false
	}
}

// volatile are the fields whose values change from run to run of the
// demo: ids and times. Durations are numbers ending in _ms, and any
// duration inside a text.
var (
	volatile   = map[string]bool{"turn_id": true, "session_id": true, "at": true, "started_at": true, "ended_at": true, "deadline": true}
	durationRE = regexp.MustCompile(`\d+(\.\d+)?(µs|ms|s|m|h)`)
)

// normalise returns a JSON text with what differs between two runs of the
// same turn replaced by placeholders.
func normalise(v any, key string) any {
	switch x := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for k, val := range x {
			out[k] = normalise(val, k)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, val := range x {
			out[i] = normalise(val, key)
		}
		return out
	case string:
		if volatile[key] {
			return "<" + key + ">"
		}
		return durationRE.ReplaceAllString(x, "<d>")
	case float64:
		if strings.HasSuffix(key, "_ms") || key == "seq" {
			return 0.0
		}
	}
	return v
}

func normalised(t *testing.T, text string) string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(text), &v); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, text)
	}
	b, _ := json.Marshal(normalise(v, ""))
	return string(b)
}

func indentJSON(s string) string {
	var b bytes.Buffer
	json.Indent(&b, []byte(s), "", "  ")
	return b.String()
}

// example checks (or with -update rewrites) the example part name of the
// page: v as indented JSON, compared without what changes from run to run.
func example(t *testing.T, name string, v any) {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	fresh := buf.String()
	page, err := os.ReadFile(eventsDoc)
	if err != nil {
		t.Fatal(err)
	}
	old, err := doctest.Get(string(page), name)
	if err != nil {
		t.Errorf("%s: %v", eventsDoc, err)
		return
	}
	committed := strings.TrimSuffix(strings.TrimPrefix(old, "```json\n"), "```\n")
	if strings.TrimSpace(committed) != "" && normalised(t, committed) == normalised(t, fresh) {
		return
	}
	if !*update {
		t.Errorf("%s: the example %q is not what a turn emits now; regenerate it with %s\n%s", eventsDoc, name, regenEvents,
			doctest.Diff(indentJSON(normalised(t, committed)), indentJSON(normalised(t, fresh))))
		return
	}
	doctest.Part(t, eventsDoc, name, "```json\n"+fresh+"```\n", true, regenEvents)
}

// TestDocsEventsExamples: each example of docs/events.md is an event (or
// record) of a real turn: the demo's, or, for what the demo does not do, a
// scripted turn's. Every event type has one.
func TestDocsEventsExamples(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the demo (about 5s)")
	}
	rec, demo := demoTurn(t)
	scripted, stopped := scriptedTurns(t)
	picks := map[event.Type]func() (event.Event, bool){
		event.TypeToolStarted:  func() (event.Event, bool) { return first(t, demo, event.TypeToolStarted, toolIs("crawl")) },
		event.TypeToolProgress: func() (event.Event, bool) { return first(t, demo, event.TypeToolProgress, toolIs("crawl")) },
		// crawl reports progress all along: the demo's one notice names
		// report, and legacy_sync when it is not killed first.
		event.TypeStillWorking: func() (event.Event, bool) { return first(t, demo, event.TypeStillWorking, toolIs("report")) },
		event.TypeToolFinished: func() (event.Event, bool) { return first(t, demo, event.TypeToolFinished, toolIs("web_fetch")) },
	}
	for _, typ := range eventTypes(t) {
		pick := picks[typ]
		if pick == nil {
			pick = func() (event.Event, bool) {
				if e, ok := first(t, demo, typ, nil); ok {
					return e, true
				}
				return first(t, scripted, typ, nil)
			}
		}
		e, ok := pick()
		if !ok {
			t.Errorf("neither the demo nor the scripted turn emits %s: extend scriptedTurns so that the page shows a real one", typ)
			continue
		}
		example(t, "example "+string(typ), e)
	}

	// The records: the demo's turn, with one of its tool calls and one of
	// its model calls, and the flags of the stopped turn.
	for _, tc := range rec.ToolCalls {
		if tc.Tool == "report" {
			example(t, "example tool call record", tc)
		}
	}
	example(t, "example model call record", rec.ModelCalls[0])
	short := *rec
	short.ToolCalls = nil
	for _, tc := range rec.ToolCalls {
		if tc.Tool == "word_count" {
			short.ToolCalls = append(short.ToolCalls, tc)
		}
	}
	short.ModelCalls = short.ModelCalls[len(short.ModelCalls)-1:]
	short.Events = nil
	example(t, "example turn record", short)
	example(t, "example stopped turn", struct {
		Status     budget.Status     `json:"status"`
		StopReason budget.StopReason `json:"stop_reason"`
		Message    string            `json:"message"`
		Flags      event.Flags       `json:"flags"`
	}{stopped.Status, stopped.StopReason, stopped.Message, stopped.Flags})
}
