package telemetry_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"go.uber.org/goleak"

	timebox "github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/internal/doctest"
	"github.com/timebox-run/timebox/internal/fakellm"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/proctree"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/telemetry"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) { proctree.Close(); os.Exit(code) }))
}

// receiver is an OTLP/HTTP trace receiver (testenv.OTLP).
type receiver = testenv.OTLP

func newReceiver(t *testing.T) *receiver { return testenv.NewOTLP(t) }

func attrs(s *tracepb.Span) map[string]*commonpb.AnyValue { return testenv.SpanAttrs(s) }

func str(s *tracepb.Span, k string) string { return attrs(s)[k].GetStringValue() }
func num(s *tracepb.Span, k string) int64  { return attrs(s)[k].GetIntValue() }

// traceparent is what a span's child is told of it.
func traceparent(s *tracepb.Span) string {
	return "00-" + hex.EncodeToString(s.GetTraceId()) + "-" + hex.EncodeToString(s.GetSpanId()) + "-01"
}

const (
	callerTrace = "4bf92f3577b34da6a3ce929d0e0e4736"
	callerSpan  = "00f067aa0ba902b7"
)

// TestTurnSpans runs a traced turn against a real OTLP/HTTP receiver: an
// OpenAI-compatible model asks for two exec tools at once, one that times
// out and one that prints the TRACEPARENT it was given, then answers. The
// spans follow the GenAI conventions, hang under the caller's span, carry
// their budgets, and the model requests and the tool carry their spans'
// traceparent.
func TestTurnSpans(t *testing.T) {
	proctest.AfterTest(t)
	recv := newReceiver(t)
	llm := fakellm.New(fakellm.OpenAI,
		fakellm.Reply{Chunks: []fakellm.Chunk{
			{Tool: &fakellm.ToolFragment{Index: 0, ID: "call_slow", Name: "slow", Arguments: "{}"}},
			{Tool: &fakellm.ToolFragment{Index: 1, ID: "call_env", Name: "env", Arguments: "{}"}},
		}},
		fakellm.Text("done", 0))
	defer llm.Close()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "env.sh"), []byte("#!/bin/sh\ncat >/dev/null\nprintf '%s' \"$TRACEPARENT\"\n"), 0o755)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte(fmt.Sprintf(`name: traced
model: {primary: "openai:gpt-x"}
providers:
  openai:
    base_url: %s
    credentials: [{api_key_env: OA_KEY}]
tools:
  - name: slow
    exec: [sleep, "30"]
    timeout: 300ms
  - name: env
    exec: [./env.sh]
    timeout: 10s
timeouts: {kill_grace: 200ms}
`, llm.BaseURL())), 0o644)

	env := map[string]string{
		"OA_KEY":                             "sk-test",
		"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": recv.URL + "/v1/traces",
		"OTEL_SERVICE_NAME":                  "tb-test",
		"OTEL_RESOURCE_ATTRIBUTES":           "deployment.environment=test",
	}
	getenv := func(k string) string { return env[k] }
	tracing, err := telemetry.FromEnv(t.Context(), getenv)
	if err != nil || tracing.Provider == nil {
		t.Fatalf("FromEnv: %v, %v", tracing, err)
	}
	a, err := timebox.Open(t.Context(), file, timebox.Options{Getenv: getenv, TracerProvider: tracing.Provider})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	ctx := agent.WithTraceParent(t.Context(), "00-"+callerTrace+"-"+callerSpan+"-01")
	res := a.Run(ctx, agent.Input{Text: "go", SessionID: "s1"})
	if res.Record.Status != "completed" {
		t.Fatalf("turn %s: %s", res.Record.Status, res.Record.Message)
	}
	shut, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := tracing.Shutdown(shut); err != nil {
		t.Fatal(err)
	}

	spans := recv.ByName()
	if bad := recv.Refused(); len(bad) > 0 {
		t.Fatalf("the receiver refused: %v", bad)
	}
	one := func(name string) *tracepb.Span {
		if len(spans[name]) != 1 {
			t.Fatalf("%d spans named %q; all: %v", len(spans[name]), name, spans)
		}
		return spans[name][0]
	}
	turn, slow, envSpan := one("invoke_agent traced"), one("execute_tool slow"), one("execute_tool env")
	chats := spans["chat gpt-x"]
	if len(chats) != 2 {
		t.Fatalf("%d chat spans", len(chats))
	}
	if got := hex.EncodeToString(turn.GetTraceId()); got != callerTrace {
		t.Errorf("the turn is in trace %s, not its caller's", got)
	}
	if got := hex.EncodeToString(turn.GetParentSpanId()); got != callerSpan {
		t.Errorf("the turn's parent is %s, not the caller's span", got)
	}
	for _, s := range append([]*tracepb.Span{slow, envSpan}, chats...) {
		if string(s.GetTraceId()) != string(turn.GetTraceId()) || string(s.GetParentSpanId()) != string(turn.GetSpanId()) {
			t.Errorf("%s is not a child of the turn's span", s.GetName())
		}
	}
	if str(turn, "gen_ai.operation.name") != "invoke_agent" || str(turn, "gen_ai.agent.name") != "traced" ||
		str(turn, "gen_ai.conversation.id") != "s1" || str(turn, "timebox.outcome") != "completed" ||
		str(turn, "timebox.budget.knob") != "timeouts.turn" || num(turn, "timebox.budget.ms") != 30*60*1000 {
		t.Errorf("the turn's attributes: %v", attrs(turn))
	}
	for i, c := range chats {
		if str(c, "gen_ai.operation.name") != "chat" || str(c, "gen_ai.provider.name") != "openai" ||
			str(c, "gen_ai.request.model") != "gpt-x" || str(c, "timebox.outcome") != "ok" ||
			num(c, "gen_ai.usage.input_tokens") != 10 || num(c, "gen_ai.usage.output_tokens") != 5 {
			t.Errorf("chat %d attributes: %v", i, attrs(c))
		}
		if c.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
			t.Errorf("chat %d is a %s span", i, c.GetKind())
		}
	}
	// The timed-out tool: error.type, its budget and the knob that sets it.
	if str(slow, "gen_ai.operation.name") != "execute_tool" || str(slow, "gen_ai.tool.name") != "slow" ||
		!strings.HasPrefix(str(slow, "gen_ai.tool.call.id"), "call_") || str(slow, "gen_ai.tool.type") != "function" ||
		str(slow, "error.type") != "timed_out" || str(slow, "timebox.outcome") != "timed_out" ||
		str(slow, "timebox.phase") != "tool" || num(slow, "timebox.budget.ms") != 300 ||
		str(slow, "timebox.budget.source") != "tool" || !strings.Contains(str(slow, "timebox.budget.knob"), "slow") ||
		str(slow, "timebox.enforcement") != "hard" || slow.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR {
		t.Errorf("the timed-out tool's span: %v, status %v", attrs(slow), slow.GetStatus())
	}
	if _, ok := attrs(envSpan)["error.type"]; ok || str(envSpan, "timebox.outcome") != "ok" {
		t.Errorf("the ok tool's span: %v", attrs(envSpan))
	}
	// What the calls were given: their own span's traceparent.
	var envRec string
	for _, c := range res.Record.ToolCalls {
		if c.Tool == "env" {
			envRec = c.Result
		}
	}
	if !strings.Contains(envRec, traceparent(envSpan)) {
		t.Errorf("the tool got TRACEPARENT %q, want %s", envRec, traceparent(envSpan))
	}
	reqs := llm.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d model requests", len(reqs))
	}
	for i, r := range reqs {
		want := ""
		for _, c := range chats {
			if num(c, "timebox.attempt") == 1 && num(c, "timebox.step") == int64(i+1) {
				want = traceparent(c)
			}
		}
		if want == "" || r.TraceParent != want {
			t.Errorf("model request %d: traceparent %q, want %q", i+1, r.TraceParent, want)
		}
	}
	if res := recv.Resource(); res["service.name"] != "tb-test" || res["deployment.environment"] != "test" {
		t.Errorf("resource %v", res)
	}
	doctest.Part(t, "../docs/observability.md", "spans", "```json\n"+spansJSON(t, recv, turn)+"```\n", *update,
		"go test ./telemetry -run TestTurnSpans -update")
}

var update = flag.Bool("update", false, "rewrite the generated parts of docs/observability.md")

// spansJSON shows the receiver's spans as the docs do: each with its
// parent's name, kind, attributes, status and events, in start order;
// ids and times, which change from run to run, are left out or masked.
func spansJSON(t *testing.T, recv *receiver, turn *tracepb.Span) string {
	spans := recv.Spans()
	// The turn, then each step's model call before its tool calls.
	key := func(s *tracepb.Span) string {
		if s == turn {
			return ""
		}
		op := 1
		if str(s, "gen_ai.operation.name") == "chat" {
			op = 0
		}
		return fmt.Sprintf("%03d-%d-%s", num(s, "timebox.step"), op, s.GetName())
	}
	slices.SortStableFunc(spans, func(a, b *tracepb.Span) int { return strings.Compare(key(a), key(b)) })
	names := map[string]string{}
	for _, s := range spans {
		names[string(s.GetSpanId())] = s.GetName()
	}
	type shown struct {
		Name       string         `json:"name"`
		Parent     string         `json:"parent"`
		Kind       string         `json:"kind"`
		Attributes map[string]any `json:"attributes"`
		Status     string         `json:"status,omitempty"`
	}
	var out []shown
	for _, s := range spans {
		a := map[string]any{}
		for k, v := range attrs(s) {
			switch x := v.GetValue().(type) {
			case *commonpb.AnyValue_StringValue:
				a[k] = x.StringValue
			case *commonpb.AnyValue_IntValue:
				a[k] = x.IntValue
			case *commonpb.AnyValue_BoolValue:
				a[k] = x.BoolValue
			case *commonpb.AnyValue_DoubleValue:
				a[k] = x.DoubleValue
			}
		}
		if _, ok := a["timebox.turn.id"]; ok {
			a["timebox.turn.id"] = "t_…"
		}
		parent := names[string(s.GetParentSpanId())]
		if parent == "" {
			parent = "(the caller's span, from its traceparent)"
		}
		sh := shown{Name: s.GetName(), Parent: parent, Kind: strings.TrimPrefix(s.GetKind().String(), "SPAN_KIND_"), Attributes: a}
		if c := s.GetStatus().GetCode(); c != tracepb.Status_STATUS_CODE_UNSET {
			sh.Status = strings.TrimPrefix(c.String(), "STATUS_CODE_")
		}
		out = append(out, sh)
	}
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return string(b) + "\n"
}

// TestFromEnv: without an endpoint nothing is set up; a bad value is an
// error naming its variable and the fix.
func TestFromEnv(t *testing.T) {
	for _, env := range []map[string]string{
		{},
		{"OTEL_SERVICE_NAME": "x"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318", "OTEL_TRACES_EXPORTER": "none"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://localhost:4318", "OTEL_SDK_DISABLED": "true"},
	} {
		tr, err := telemetry.FromEnv(t.Context(), func(k string) string { return env[k] })
		if err != nil || tr.Provider != nil {
			t.Errorf("%v: %v, %v", env, tr, err)
		}
		if err := tr.Shutdown(t.Context()); err != nil {
			t.Error(err)
		}
	}
	for env, want := range map[[2]string]string{
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318"}:            "OTEL_EXPORTER_OTLP_ENDPOINT=\"localhost:4318\" is not an http:// or https:// URL",
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "ftp://x"}:            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
		{"OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"}:                      "use http/protobuf",
		{"OTEL_TRACES_EXPORTER", "zipkin"}:                           "use otlp, or none",
		{"OTEL_RESOURCE_ATTRIBUTES", "service.namespace"}:            "is not key=value",
		{"OTEL_RESOURCE_ATTRIBUTES", "a=%zz"}:                        "not percent-encoded",
		{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"}:          "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1"}:               "is not an http:// or https:// URL",
		{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https:///v1/traces"}: "is not an http:// or https:// URL",
		// A password in the value is not shown.
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "ftp://user:s3cretpw@h"}:     `"ftp://user:xxxxx@h" is not an http://`,
		{"OTEL_EXPORTER_OTLP_ENDPOINT", "http://user:s3cretpw@[::1"}: "OTEL_EXPORTER_OTLP_ENDPOINT=a value that does not parse",
	} {
		err := telemetry.Check(func(k string) string {
			if k == env[0] {
				return env[1]
			}
			return ""
		})
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cretpw") {
			t.Errorf("%s=%s: %v, want %q", env[0], env[1], err, want)
		}
	}
}
