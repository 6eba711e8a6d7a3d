package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/server"
)

// TestTraceparentHeaderParentsTheTurn: a traceparent header on POST
// /v1/turns makes the turn's span its child, though the turn outlives the
// request; without one the turn starts a trace of its own.
func TestTraceparentHeaderParentsTheTurn(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(t.Context())
	a, err := agent.New(agent.Config{Name: "traced", Models: []model.Endpoint{{Provider: scripted(t, `{"text": "one"}`, `{"text": "two"}`), ProviderName: "script", Model: "m"}},
		TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, server.Config{Agent: a})
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for _, hdr := range [][]string{{"traceparent", parent}, nil} {
		resp := e.do(http.MethodPost, "/v1/turns", map[string]any{"input": "hi"}, hdr...)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var out struct {
			TurnID string `json:"turn_id"`
		}
		json.Unmarshal(b, &out)
		var turn sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			for _, kv := range s.Attributes() {
				if kv.Key == "timebox.turn.id" && kv.Value.AsString() == out.TurnID {
					turn = s
				}
			}
		}
		if turn == nil {
			t.Fatalf("no span for turn %s (%s)", out.TurnID, b)
		}
		if hdr != nil {
			if turn.Parent().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || turn.Parent().SpanID().String() != "00f067aa0ba902b7" || !turn.Parent().IsRemote() {
				t.Errorf("with a traceparent header the turn's parent is %v", turn.Parent())
			}
		} else if turn.Parent().IsValid() {
			t.Errorf("without a traceparent header the turn has parent %v", turn.Parent())
		}
	}
}
