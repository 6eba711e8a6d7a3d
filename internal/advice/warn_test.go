package advice_test

import (
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/advice"
	"github.com/timebox-run/timebox/store"
)

func named(name string, timeout time.Duration, enf budget.Enforcement) advice.NamedBudget {
	return advice.NamedBudget{Name: name, Budget: budget.ToolBudget{Enforcement: enf,
		Timeout: budget.Duration{D: timeout, Source: budget.SourceTool, Knob: "tools[" + name + "].timeout in agent.yaml"}}}
}

func TestImpossible(t *testing.T) {
	idle := named("crawl", time.Minute, budget.Hard)
	idle.Budget.IdleTimeout = budget.Duration{D: 2 * time.Millisecond, Source: budget.SourceTool, Knob: "tools[crawl].idle_timeout in agent.yaml"}
	got := advice.Impossible([]advice.NamedBudget{named("quick", 5*time.Millisecond, budget.Hard), named("fine", 10*time.Millisecond, budget.Hard), idle})
	if len(got) != 2 || !strings.HasPrefix(got[0], "tool quick: timeout 5ms (tools[quick].timeout in agent.yaml) cannot be right") ||
		!strings.HasPrefix(got[1], "tool crawl: idle_timeout 2ms (tools[crawl].idle_timeout in agent.yaml) cannot be right") {
		t.Errorf("Impossible:\n%s", strings.Join(got, "\n"))
	}
}

func TestContradicted(t *testing.T) {
	stats := map[string]store.ToolStat{
		"short":    {Tool: "short", Sample: 400, P95MS: 1800, P99MS: 2900, MaxMS: 5000, MaxOKMS: 4700, CutOff: 40, CutOffTimeoutMS: 1000},
		"advisory": {Tool: "advisory", Sample: 400, P95MS: 1800, P99MS: 2900, MaxMS: 5000, MaxOKMS: 4700},
		"long":     {Tool: "long", Sample: 400, P95MS: 1800, P99MS: 2900, MaxMS: 5000, MaxOKMS: 4700},
		"fine":     {Tool: "fine", Sample: 400, P95MS: 1800, P99MS: 2900, MaxMS: 5000, MaxOKMS: 4700},
		"default":  {Tool: "default", Sample: 400, P95MS: 180, P99MS: 290, MaxMS: 500, MaxOKMS: 470},
		"few":      {Tool: "few", Sample: 19, P95MS: 1800, P99MS: 2900, MaxMS: 5000, MaxOKMS: 4700},
		"just":     {Tool: "just", Sample: 34, P95MS: 1003, P99MS: 1010, MaxMS: 1010, MaxOKMS: 900, CutOff: 30, CutOffTimeoutMS: 1000},
	}
	tools := []advice.NamedBudget{
		named("short", time.Second, budget.Hard), named("advisory", time.Second, budget.Advisory),
		named("long", 10*time.Minute, budget.Hard), named("fine", 10*time.Second, budget.Hard),
		named("default", time.Minute, budget.Hard), named("few", time.Second, budget.Hard), named("unused", time.Second, budget.Hard),
		named("just", time.Second, budget.Hard),
	}
	got := advice.Contradicted(tools, stats, time.Date(2026, 10, 2, 9, 0, 0, 0, time.Local))
	want := []string{
		"tool short: timeout 1s (tools[short].timeout in agent.yaml) is below 1.8s, the p95 of its 400 calls since 2026-10-02: one call in twenty or more is cut off by it; timebox stats suggests 10s",
		"tool advisory: timeout 1s (tools[advisory].timeout in agent.yaml) is below 1.8s, the p95 of its 400 calls since 2026-10-02: one call in twenty or more overruns it; timebox stats suggests 10s",
		"tool long: timeout 10m (tools[long].timeout in agent.yaml) is more than 10 times the longest of its 400 calls since 2026-10-02 (5s): a hung call holds its turn 10m before it is stopped; timebox stats suggests 10s",
		// A p95 that rounds to the timeout is shown to the millisecond.
		"tool just: timeout 1s (tools[just].timeout in agent.yaml) is below 1.003s, the p95 of its 34 calls since 2026-10-02: one call in twenty or more is cut off by it; timebox stats suggests 2s",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Contradicted:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
