package agent_test

import (
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
)

func TestRetryAfterIsHonouredInsideTheTurn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		limited := lines(t, `{"error": {"status": 429, "message": "rate limited", "retry_after": "5s"}}`, `{"text": "after the wait"}`)
		down := lines(t, `{"error": {"status": 503, "message": "unavailable"}}`)
		start := time.Now()
		res, rec := fixture{models: []model.Endpoint{endpoint(limited, "a"), endpoint(down, "b")}}.run(t, t.Context(), "hi")
		r := res.Record
		if r.StopReason != budget.Answered || r.Answer != "after the wait" {
			t.Fatalf("got %s: %s", r.StopReason, r.Message)
		}
		if d := time.Since(start); d != 5*time.Second {
			t.Fatalf("answered after %s, want the 5s Retry-After", d)
		}
		fo := rec.ofType(event.TypeFailover)
		if len(fo) != 2 || fo[1].Data.(*event.Failover).To != "script:a" || !strings.Contains(fo[1].Data.(*event.Failover).Reason, "Retry-After") {
			t.Fatalf("failovers %+v", fo)
		}
		if len(r.ModelCalls) != 3 || r.ModelCalls[0].Phase != budget.PhaseLLMHTTP || r.ModelCalls[2].Outcome != event.OutcomeOK {
			t.Fatalf("model calls %+v", r.ModelCalls)
		}
	})
}

func TestRetryAfterBeyondTheTurnIsNotWaited(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		limited := lines(t, `{"error": {"status": 429, "message": "rate limited", "retry_after": "1h"}}`)
		start := time.Now()
		res, _ := fixture{models: []model.Endpoint{endpoint(limited, "a")}}.run(t, t.Context(), "hi")
		r := res.Record
		if r.StopReason != budget.ModelUnavailable || time.Since(start) != 0 || !strings.Contains(r.Message, "HTTP 429: rate limited") {
			t.Fatalf("got %s after %s: %s", r.StopReason, time.Since(start), r.Message)
		}
	})
}
