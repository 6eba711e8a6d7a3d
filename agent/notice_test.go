package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/tool"
)

// Quieter notices (issue 25): a turn sends at most one still_working per
// timeouts.progress_notice (30s by default here), naming every call that
// has been silent for the interval and leaving out those that reported
// progress within it (docs/decisions/quieter-notices.md). Time is
// synctest's, so each beat falls at an exact instant.

// sleeper is a tool that runs for d and says nothing.
func sleeper(name string, d time.Duration) agent.Tool {
	return goTool(name, budget.Cooperative, 5*time.Minute, func(context.Context, json.RawMessage, tool.Progress) (any, error) {
		time.Sleep(d)
		return "ok", nil
	})
}

// reportingTool is a tool that reports progress after each of waits.
func reportingTool(name string, waits ...time.Duration) agent.Tool {
	return goTool(name, budget.Cooperative, 5*time.Minute, func(_ context.Context, _ json.RawMessage, p tool.Progress) (any, error) {
		for i, w := range waits {
			time.Sleep(w)
			p.Report(tool.Report{Message: fmt.Sprintf("part %d", i+1)})
		}
		return "ok", nil
	})
}

// notices returns the turn's still_working notices, each as "elapsed:
// call silent, call silent" (in ms), checking that the top-level fields
// describe the calls the notice names.
func notices(t *testing.T, rec *recorder) []string {
	t.Helper()
	var out []string
	for _, e := range rec.ofType(event.TypeStillWorking) {
		sw := e.Data.(*event.StillWorking)
		var parts []string
		var longest int64
		for _, c := range sw.Calls {
			name := c.Tool
			if name == "" {
				name = c.Subject
			}
			parts = append(parts, fmt.Sprintf("%s %d", name, c.SilentMS))
			longest = max(longest, c.ElapsedMS)
		}
		if len(sw.Calls) == 0 || sw.ElapsedMS != longest {
			t.Fatalf("still_working %+v: its elapsed_ms is not its calls' longest", sw)
		}
		if c := sw.Calls[0]; len(sw.Calls) == 1 && (sw.Subject != c.Subject || sw.CallID != c.CallID || sw.LimitMS != c.LimitMS) {
			t.Fatalf("still_working %+v: one call, but its top-level fields are not the call's", sw)
		}
		if len(sw.Calls) > 1 && (sw.CallID != "" || sw.LimitMS != 0 || !strings.HasPrefix(sw.Subject, "tools ")) {
			t.Fatalf("still_working %+v: several calls, but it reads as one", sw)
		}
		out = append(out, fmt.Sprintf("%d: %s", sw.ElapsedMS, strings.Join(parts, ", ")))
	}
	return out
}

func TestQuieterNotices(t *testing.T) {
	for _, tc := range []struct {
		name     string
		script   string
		tools    []agent.Tool
		parallel int64
		want     []string
	}{{
		// The demo's case: crawl reports all along, report and
		// legacy_sync say nothing. Per call, this was 6 notices.
		name:   "one notice a beat names every silent call, none the reporting one",
		script: `{"tool_calls": [{"name": "quiet_a"}, {"name": "busy"}, {"name": "quiet_b"}]}`,
		tools: []agent.Tool{sleeper("quiet_a", 70*time.Second), sleeper("quiet_b", 70*time.Second),
			reportingTool("busy", 10*time.Second, 10*time.Second, 10*time.Second, 10*time.Second, 10*time.Second, 10*time.Second, 10*time.Second)},
		want: []string{"30000: quiet_a 30000, quiet_b 30000", "60000: quiet_a 60000, quiet_b 60000"},
	}, {
		name:   "a call reporting within every interval gets no notice at all",
		script: `{"tool_calls": [{"name": "busy"}]}`,
		tools:  []agent.Tool{reportingTool("busy", 29*time.Second, 29*time.Second, 29*time.Second, 29*time.Second)},
		want:   nil,
	}, {
		// Reported 1ms before the beat at 30s: that beat is silent; the
		// call stays silent and the next beat names it.
		name:   "a report 1ms before a beat takes the call out of that beat only",
		script: `{"tool_calls": [{"name": "late_report"}]}`,
		tools:  []agent.Tool{reportingTool("late_report", 30*time.Second-time.Millisecond, 45*time.Second)},
		want:   []string{"60000: late_report 30001"},
	}, {
		// Reported 1ms after the beat at 30s: the beat at 60s finds a
		// report within its interval, if only just; the one at 90s names
		// the call again.
		name:   "a report 1ms after a beat takes the call out of the next",
		script: `{"tool_calls": [{"name": "early_report"}]}`,
		tools:  []agent.Tool{reportingTool("early_report", 30*time.Second+time.Millisecond, 70*time.Second)},
		want:   []string{"30000: early_report 30000", "90000: early_report 59999"},
	}, {
		// Two slots: late starts when first ends, 5s before the beat at
		// 30s. Named at 30s it would read "5s"; it waits for the beat at
		// 60s, which names it with long.
		name:     "a call started less than half an interval before a beat waits for the next",
		script:   `{"tool_calls": [{"name": "first"}, {"name": "long"}, {"name": "late"}]}`,
		tools:    []agent.Tool{sleeper("first", 25*time.Second), sleeper("long", 100*time.Second), sleeper("late", 50*time.Second)},
		parallel: 2,
		want:     []string{"30000: long 30000", "60000: long 60000, late 35000", "90000: long 90000"},
	}, {
		// A model call is silent until its first chunk; then its chunks,
		// every 10s, are its progress. Per call, this was 3 notices.
		name:   "a model call is named while it waits for its reply, not while it streams",
		script: `{"chunks": ["a ", "b ", "c ", "d ", "e ", "f ", "g"], "first_chunk_delay": "50s", "chunk_delay": "10s"}`,
		want:   []string{"30000: model m 30000"},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := lines(t, tc.script, `{"text": "ok"}`)
				l := budget.DefaultLimits()
				if tc.parallel > 0 {
					l.ParallelTools.N = tc.parallel
				}
				res, rec := fixture{models: []model.Endpoint{endpoint(p, "m")}, tools: tc.tools, limits: l}.run(t, t.Context(), "go")
				if res.Record.StopReason != budget.Answered {
					t.Fatal(res.Record.Message)
				}
				if got := notices(t, rec); fmt.Sprint(got) != fmt.Sprint(tc.want) {
					t.Fatalf("still_working notices\n got %q\nwant %q", got, tc.want)
				}
			})
		})
	}
}
