package config

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/model/script"
	"github.com/timebox-run/timebox/tool"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// outcome renders what Load returned, for a golden file: every error, or
// "ok", then every warning.
func outcome(a *Agent, err error) string {
	var b strings.Builder
	switch {
	case err == nil:
		b.WriteString("ok\n")
	default:
		var es Errors
		if !errors.As(err, &es) {
			b.WriteString("error is not config.Errors: " + err.Error() + "\n")
			break
		}
		for _, e := range es {
			b.WriteString(e.Error() + "\n")
		}
	}
	if a != nil {
		for _, w := range a.Warnings {
			b.WriteString("warning: " + w + "\n")
		}
	}
	return b.String()
}

// checkGolden compares got with testdata/golden/name.golden, or rewrites
// the file with -update.
func checkGolden(t *testing.T, dir, name, got string) {
	t.Helper()
	path := filepath.Join(dir, name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./config -run %s -update to create it)", err, t.Name())
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (run with -update if the change is intended)\n--- got\n%s--- want\n%s", name, path, got, want)
	}
}

func goldenDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("testdata", "golden"))
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestErrors loads every file of testdata/errors, alone or with flags and
// variables, and compares everything Load said with a golden file. The
// test runs inside testdata/errors so that messages read "agent.yaml:14:14"
// as a person would see them.
func TestErrors(t *testing.T) {
	gd := goldenDir(t)
	t.Chdir(filepath.Join("testdata", "errors"))

	type tc struct {
		name  string
		file  string
		flags map[string]string
		env   []string
	}
	cases := []tc{
		{name: "missing_file", file: "does_not_exist.yaml"},
		{name: "flags_bad", file: "ok.yaml", flags: map[string]string{
			budget.KeyTool:          "abc",
			budget.KeyTurn:          "",
			budget.KeyMaxSteps:      "0",
			budget.KeyMaxToolOutput: "1MB",
			budget.KeyStep:          "10",
			"timeouts.tool_maxx":    "1h",
		}},
		{name: "env_bad", file: "ok.yaml", env: []string{
			"TIMEBOX_TOOL_TIMEOUT=10 mins",
			"TIMEBOX_TURN_TIMEOUT=-1m",
			"TIMEBOX_MAX_STEPS=many",
			"TIMEBOX_IDLE_BREAKER=0",
			"TIMEBOX_KILL_GRACE=25h",
		}},
		{name: "env_warnings", file: "ok.yaml", env: []string{
			"PATH=/bin",
			"TIMEBOX_TOOL_TIMOUT=5s",
			"TIMEBOX_MAXSTEPS=3",
			"TIMEBOX_FROBNICATE=1",
			"TIMEBOX_STEP_TIMEOUT=",
			"TIMEBOX_DB=x.db", "TIMEBOX_TOKEN=t", "TIMEBOX_ADDR=:1", "TIMEBOX_CALL=1", "TIMEBOX_PROCTREE=cgroup",
		}},
		{name: "flag_over_tool_max", file: "ok.yaml", flags: map[string]string{budget.KeyTool: "2h"}},
		{name: "env_tool_max_below_default", file: "ok.yaml", env: []string{"TIMEBOX_TOOL_MAX=30s"}},
		{name: "flag_tool_max_below_tool", file: "tool_timeouts.yaml", flags: map[string]string{budget.KeyToolMax: "5s"}},
		{name: "mixed", file: "many.yaml",
			flags: map[string]string{budget.KeyTool: "1 minute"},
			env:   []string{"TIMEBOX_PARALLEL_TOOLS=-4", "TIMEBOX_PARALELL_TOOLS=4"}},
		{name: "syntax_and_flags", file: "syntax.yaml", flags: map[string]string{budget.KeyTurn: "forever"}},
	}
	files, err := filepath.Glob("*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		cases = append(cases, tc{name: strings.TrimSuffix(f, ".yaml"), file: f})
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, err := Load(c.file, Overrides{Flags: c.flags, Env: c.env})
			checkGolden(t, gd, c.name, outcome(a, err))
		})
	}
}

// TestSpecMessage checks the one message the spec spells out, byte for
// byte.
func TestSpecMessage(t *testing.T) {
	t.Chdir(filepath.Join("testdata", "errors"))
	_, err := Load("agent.yaml", Overrides{})
	want := `agent.yaml:14:14: tools[2].timeout: "10 mins" is not a duration (use 10m)`
	if err == nil || err.Error() != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}
	var es Errors
	if !errors.As(err, &es) || len(es) != 1 {
		t.Fatalf("want one config.Errors, got %#v", err)
	}
	e := es[0]
	if e.File != "agent.yaml" || e.Line != 14 || e.Col != 14 || e.Key != "tools[2].timeout" {
		t.Errorf("fields: %+v", *e)
	}
}

// TestManyAtOnce checks that several problems of one file are reported
// together, in reading order, each at its own line and column.
func TestManyAtOnce(t *testing.T) {
	t.Chdir(filepath.Join("testdata", "errors"))
	_, err := Load("many.yaml", Overrides{})
	var es Errors
	if !errors.As(err, &es) {
		t.Fatalf("want config.Errors, got %v", err)
	}
	type at struct {
		line, col int
		key       string
	}
	want := []at{
		{3, 12, "model.primary"},
		{5, 9, "timeouts.tool"},
		{6, 9, "timeouts.turn"},
		{8, 14, "limits.max_steps"},
		{11, 11, "tools[0].exec"},
		{12, 14, "tools[0].timeout"},
		{13, 18, "tools[0].enforcement"},
		{14, 11, "tools[1].name"},
		{16, 5, "tools[1]"},
	}
	var got []at
	for _, e := range es {
		got = append(got, at{e.Line, e.Col, e.Key})
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got\n%v\nwant\n%v\n%v", got, want, err)
	}
}

// TestReference loads the agent file of spec §15 and checks every value
// it resolves to.
func TestReference(t *testing.T) {
	a, err := Load(filepath.Join("testdata", "reference", "agent.yaml"), Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	dir, _ := filepath.Abs(filepath.Join("testdata", "reference"))
	if a.Dir != dir || a.Name != "demo" || a.Instructions != "You are a helpful assistant.\n" {
		t.Errorf("Dir %q Name %q Instructions %q", a.Dir, a.Name, a.Instructions)
	}
	if len(a.Warnings) != 0 {
		t.Errorf("warnings: %q", a.Warnings)
	}
	wantChain := []ModelRef{{"openai", "gpt-4o-mini"}, {"anthropic", "claude-haiku"}, {"openai", "gpt-4o"}}
	if !reflect.DeepEqual(a.Model.All(), wantChain) {
		t.Errorf("chain %v", a.Model.All())
	}
	wantProviders := map[string]Provider{
		"openai": {BaseURL: "https://api.openai.com/v1", Credentials: []Credential{
			{APIKeyEnv: "OPENAI_API_KEY"}, {APIKeyEnv: "OPENAI_API_KEY_BACKUP"}}},
		"anthropic": {Credentials: []Credential{{APIKeyEnv: "ANTHROPIC_API_KEY"}}},
		"script":    {File: filepath.Join(dir, "script.jsonl"), Script: []script.Line{{Text: "hello"}}},
	}
	if !reflect.DeepEqual(a.Providers, wantProviders) {
		t.Errorf("providers %#v", a.Providers)
	}

	// Every value of the file is the default, set in the file.
	fromFile := func(d budget.Duration) budget.Duration {
		d.Source = budget.SourceFile
		return d
	}
	def := budget.Defaults()
	wantBudgets := budget.Budgets{
		Tool: fromFile(def.Tool), ToolMax: fromFile(def.ToolMax), LLMFirstChunk: fromFile(def.LLMFirstChunk),
		LLMIdle: fromFile(def.LLMIdle), LLMBudget: fromFile(def.LLMBudget), Step: fromFile(def.Step),
		Turn: fromFile(def.Turn), ProgressNotice: fromFile(def.ProgressNotice), KillGrace: fromFile(def.KillGrace),
		Compaction: fromFile(def.Compaction),
		Approval:   def.Approval, // the spec's file predates approvals
	}
	if a.Budgets != wantBudgets {
		t.Errorf("budgets\n got %+v\nwant %+v", a.Budgets, wantBudgets)
	}
	lim := budget.DefaultLimits()
	for _, c := range []*budget.Count{&lim.MaxSteps, &lim.MaxToolCalls, &lim.ParallelTools, &lim.MaxToolOutput, &lim.IdleBreaker} {
		c.Source = budget.SourceFile
	}
	if a.Limits != lim {
		t.Errorf("limits\n got %+v\nwant %+v", a.Limits, lim)
	}
	// The spec's file predates context.time_notes: it takes the default.
	if a.Context != (Context{CompactAt: 100000, Source: budget.SourceFile, Knob: KeyCompactAt,
		TimeNotes: true, TimeNotesSource: budget.SourceDefault, TimeNotesKnob: KeyTimeNotes}) {
		t.Errorf("context %+v", a.Context)
	}
	if a.Server.ShutdownGrace != (budget.Duration{D: 10 * time.Second, Source: budget.SourceFile, Knob: KeyShutdownGrace}) {
		t.Errorf("server %+v", a.Server)
	}
	if !reflect.DeepEqual(a.Profiles, budget.DefaultProfiles()) {
		t.Errorf("profiles %v", a.Profiles)
	}

	if len(a.Tools) != 3 {
		t.Fatalf("%d tools", len(a.Tools))
	}
	wc, crawl, every := a.Tools[0], a.Tools[1], a.Tools[2]
	wantWC := Tool{
		Name: "word_count", Description: "Counts the words of a text.",
		InputSchema: []byte(`{"properties":{"text":{"type":"string"}},"required":["text"],"type":"object"}`),
		Kind:        tool.KindExec,
		Budget: budget.ToolBudget{
			Timeout:     budget.Duration{D: 5 * time.Second, Source: "profile:fast", Knob: "tools[word_count].timeout in agent.yaml"},
			IdleTimeout: budget.Duration{Source: budget.SourceDefault, Knob: "tools[word_count].idle_timeout in agent.yaml"},
			Enforcement: budget.Hard, KillGrace: fromFile(def.KillGrace),
		},
		Approval: ApprovalNever, ApprovalTimeout: def.Approval,
		Exec:    []string{filepath.Join(dir, "tools", "word_count.sh")},
		Workdir: dir,
	}
	if !reflect.DeepEqual(wc, wantWC) {
		t.Errorf("word_count\n got %+v\nwant %+v", wc, wantWC)
	}
	wantCrawl := Tool{
		Name: "crawl", Description: "Crawls a site.", Kind: tool.KindExec,
		Budget: budget.ToolBudget{
			Timeout:     budget.Duration{D: 10 * time.Minute, Source: budget.SourceTool, Knob: "tools[crawl].timeout in agent.yaml"},
			IdleTimeout: budget.Duration{D: 15 * time.Second, Source: budget.SourceTool, Knob: "tools[crawl].idle_timeout in agent.yaml"},
			Enforcement: budget.Hard, KillGrace: fromFile(def.KillGrace),
		},
		Approval: ApprovalNever, ApprovalTimeout: def.Approval,
		Exec:    []string{filepath.Join(dir, "tools", "crawl.sh"), "--depth", "2"},
		Env:     []string{"HOME", "PATH"},
		Workdir: filepath.Join(dir, "data"),
	}
	if !reflect.DeepEqual(crawl, wantCrawl) {
		t.Errorf("crawl\n got %+v\nwant %+v", crawl, wantCrawl)
	}
	wantEvery := Tool{
		Name: "everything", Kind: tool.KindMCP,
		Budget: budget.ToolBudget{
			Timeout:     budget.Duration{D: 2 * time.Minute, Source: budget.SourceTool, Knob: "tools[everything].timeout in agent.yaml"},
			IdleTimeout: budget.Duration{Source: budget.SourceDefault, Knob: "tools[everything].idle_timeout in agent.yaml"},
			Enforcement: budget.Hard, KillGrace: fromFile(def.KillGrace),
		},
		Approval: ApprovalNever, ApprovalTimeout: def.Approval,
		MCP: &MCP{
			Command: []string{"npx", "-y", "@modelcontextprotocol/server-everything"},
			Overrides: map[string]Override{"trigger-long-running-operation": {
				Timeout: budget.Duration{D: 30 * time.Second, Source: budget.SourceTool,
					Knob: "tools[everything].overrides[trigger-long-running-operation].timeout in agent.yaml"},
				IdleTimeout: budget.Duration{D: 5 * time.Second, Source: budget.SourceTool,
					Knob: "tools[everything].overrides[trigger-long-running-operation].idle_timeout in agent.yaml"},
			}},
		},
	}
	if !reflect.DeepEqual(every, wantEvery) {
		t.Errorf("everything\n got %+v %+v\nwant %+v %+v", every, every.MCP, wantEvery, wantEvery.MCP)
	}

	var table bytes.Buffer
	if err := WriteTable(&table, a); err != nil {
		t.Fatal(err)
	}
	checkGolden(t, goldenDir(t), "reference_table", table.String())
}

// TestAByteOrderMarkIsNotPartOfTheFile: an agent file saved with a UTF-8
// byte-order mark (Notepad) loads as the same file without it, its errors
// at the columns its editor shows.
func TestAByteOrderMarkIsNotPartOfTheFile(t *testing.T) {
	if _, err := Load(writeAgent(t, "\xef\xbb\xbfmodel: {primary: \"script:x\"}\nproviders: {script: {file: script.jsonl}}\n"), Overrides{}); err != nil {
		t.Fatalf("a file with a BOM: %v", err)
	}
	_, err := Load(writeAgent(t, "\xef\xbb\xbfmodel: {primary: 5}\n"), Overrides{})
	if err == nil || !strings.Contains(err.Error(), "agent.yaml:1:18: model.primary:") || strings.Contains(err.Error(), "unknown key") {
		t.Fatalf("a bad file with a BOM: %v", err)
	}
}

// TestGluedPairsInFlowListsAreStrings: `[script:n]` and `[echo, a:b]` are
// lists of strings in YAML; the YAML reader takes a:b there for a mapping
// of one pair, and the loader reads it as YAML means it. A mapping written
// as one (`{a: b}`) is still refused.
func TestGluedPairsInFlowListsAreStrings(t *testing.T) {
	path := writeAgent(t, "model: {primary: script:m, fallbacks: [script:n]}\nproviders: {script: {file: script.jsonl}}\n"+
		"tools: [{name: a, exec: [/bin/echo, a:b, k:1]}]\n")
	a, err := Load(path, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Model.Fallbacks; len(got) != 1 || got[0].Provider != "script" || got[0].Model != "n" {
		t.Errorf("fallbacks %+v", got)
	}
	if got := a.Tools[0].Exec; !slices.Equal(got, []string{"/bin/echo", "a:b", "k:1"}) {
		t.Errorf("exec %q", got)
	}
	_, err = Load(writeAgent(t, "model: {primary: script:m}\nproviders: {script: {file: script.jsonl}}\ntools: [{name: a, exec: [/bin/echo, {a: b}]}]\n"), Overrides{})
	if err == nil || !strings.Contains(err.Error(), "tools[0].exec[1]: expected a string, found a mapping") {
		t.Errorf("{a: b}: %v", err)
	}
}

// TestAFileThatIsNotUTF8IsRefused: a byte that is not part of a UTF-8
// character (a file saved as Latin-1) is refused at its line and column;
// the YAML reader would have read it as U+FFFD without a word.
func TestAFileThatIsNotUTF8IsRefused(t *testing.T) {
	_, err := Load(writeAgent(t, "# caf\xc3\xa9 is fine\nmodel: {primary: \"script:m\xe9\"}\n"), Overrides{})
	if err == nil || !strings.Contains(err.Error(), "agent.yaml:2:27: the file is not UTF-8 text: byte 0xe9") {
		t.Fatalf("%v", err)
	}
}

// TestCRLFFilesPlaceProblemsOnTheirLines: an agent file saved with
// Windows line endings places its problems on the lines its editor shows;
// the YAML reader counted each comment's CRLF as two lines.
func TestCRLFFilesPlaceProblemsOnTheirLines(t *testing.T) {
	body := "# a comment\n# another\nmodel: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\n# c\ntimeouts:\n  tool: 10 mins\n"
	for _, b := range []string{body, strings.ReplaceAll(body, "\n", "\r\n")} {
		_, err := Load(writeAgent(t, b), Overrides{})
		if err == nil || !strings.Contains(err.Error(), "agent.yaml:7:9: timeouts.tool:") {
			t.Errorf("%q: %v", b[:12], err)
		}
	}
}

// writeAgent writes an agent file (and the script file it may name) into
// a fresh directory and returns its path.
func writeAgent(t *testing.T, body string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"text": "hi"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "agent.yaml")
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestDefaults checks that a file with only a model resolves every budget
// to the spec's default, with source "default" and the key as knob.
func TestDefaults(t *testing.T) {
	path := writeAgent(t, "model: {primary: 'openai:gpt-4o-mini'}\ntools: [{name: t, exec: [echo, hi]}]\n")
	a, err := Load(path, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if a.Budgets != budget.Defaults() {
		t.Errorf("budgets\n got %+v\nwant %+v", a.Budgets, budget.Defaults())
	}
	if a.Limits != budget.DefaultLimits() {
		t.Errorf("limits\n got %+v\nwant %+v", a.Limits, budget.DefaultLimits())
	}
	if a.Context != (Context{CompactAt: 100000, Source: budget.SourceDefault, Knob: KeyCompactAt,
		TimeNotes: true, TimeNotesSource: budget.SourceDefault, TimeNotesKnob: KeyTimeNotes}) {
		t.Errorf("context %+v", a.Context)
	}
	if a.Server.ShutdownGrace != (budget.Duration{D: 10 * time.Second, Source: budget.SourceDefault, Knob: KeyShutdownGrace}) {
		t.Errorf("server %+v", a.Server)
	}
	if !reflect.DeepEqual(a.Profiles, budget.DefaultProfiles()) {
		t.Errorf("profiles %v", a.Profiles)
	}
	if got := a.Providers["openai"].Credentials; !reflect.DeepEqual(got, []Credential{{APIKeyEnv: "OPENAI_API_KEY"}}) {
		t.Errorf("default credential %v", got)
	}
	tl := a.Tools[0]
	want := budget.ToolBudget{
		Timeout:     budget.Duration{D: 60 * time.Second, Source: budget.SourceDefault, Knob: budget.KeyTool},
		IdleTimeout: budget.Duration{Source: budget.SourceDefault, Knob: "tools[t].idle_timeout in agent.yaml"},
		Enforcement: budget.Hard, KillGrace: budget.Defaults().KillGrace,
	}
	if tl.Budget != want {
		t.Errorf("tool budget\n got %+v\nwant %+v", tl.Budget, want)
	}
	// A program without a slash is left for PATH, and an entry without
	// env inherits everything (nil, not empty).
	if !reflect.DeepEqual(tl.Exec, []string{"echo", "hi"}) || tl.Env != nil || tl.Workdir != a.Dir {
		t.Errorf("exec %q env %v workdir %q", tl.Exec, tl.Env, tl.Workdir)
	}
	// The Settings table agrees with the budget package's defaults.
	for _, s := range Settings {
		v, src, knob := settingValue(a, s)
		if src != budget.SourceDefault || knob != s.Key {
			t.Errorf("%s: source %q knob %q", s.Key, src, knob)
		}
		n, problem := s.parse(value{text: s.Default})
		if problem != "" || n != v {
			t.Errorf("%s: Default %q parses to %d (%s), the budget package says %d", s.Key, s.Default, n, problem, v)
		}
	}
}

// TestPrecedence checks flag > environment > file > default for the tool
// timeout and for other keys, with the exact sources and knobs, and that a
// tool's own timeout or profile beats all of them.
func TestPrecedence(t *testing.T) {
	const withFile = `model: {primary: 'script:demo'}
providers: {script: {file: script.jsonl}}
timeouts: {tool: 45s, kill_grace: 3s, profiles: {slow: 20m, custom: 7s}}
limits: {max_steps: 10}
tools:
  - {name: own, exec: [echo], timeout: 10s}
  - {name: prof, exec: [echo], timeout: slow}
  - {name: custom, exec: [echo], timeout: custom}
  - {name: fast, exec: [echo], timeout: fast}
  - {name: plain, exec: [echo]}
`
	const withoutFile = `model: {primary: 'script:demo'}
providers: {script: {file: script.jsonl}}
tools:
  - {name: own, exec: [echo], timeout: 10s}
  - {name: prof, exec: [echo], timeout: slow}
  - {name: custom, exec: [echo], timeout: 7s}
  - {name: fast, exec: [echo], timeout: fast}
  - {name: plain, exec: [echo]}
`
	d := func(v time.Duration, src budget.Source, knob string) budget.Duration {
		return budget.Duration{D: v, Source: src, Knob: knob}
	}
	c := func(n int64, src budget.Source, knob string) budget.Count {
		return budget.Count{N: n, Source: src, Knob: knob}
	}
	cases := []struct {
		name      string
		file      string
		flags     map[string]string
		env       []string
		tool      budget.Duration
		maxSteps  budget.Count
		killGrace budget.Duration
		slow      time.Duration
	}{
		{"default", withoutFile, nil, nil,
			d(60*time.Second, "default", "timeouts.tool"), c(25, "default", "limits.max_steps"),
			d(2*time.Second, "default", "timeouts.kill_grace"), 10 * time.Minute},
		{"file", withFile, nil, nil,
			d(45*time.Second, "file", "timeouts.tool"), c(10, "file", "limits.max_steps"),
			d(3*time.Second, "file", "timeouts.kill_grace"), 20 * time.Minute},
		{"env beats file", withFile, nil,
			[]string{"TIMEBOX_TOOL_TIMEOUT=90s", "TIMEBOX_MAX_STEPS=20", "TIMEBOX_KILL_GRACE=0"},
			d(90*time.Second, "env", "TIMEBOX_TOOL_TIMEOUT"), c(20, "env", "TIMEBOX_MAX_STEPS"),
			d(0, "env", "TIMEBOX_KILL_GRACE"), 20 * time.Minute},
		{"env beats default", withoutFile, nil, []string{"TIMEBOX_TOOL_TIMEOUT=90s"},
			d(90*time.Second, "env", "TIMEBOX_TOOL_TIMEOUT"), c(25, "default", "limits.max_steps"),
			d(2*time.Second, "default", "timeouts.kill_grace"), 10 * time.Minute},
		{"flag beats env beats file", withFile,
			map[string]string{"timeouts.tool": "2m", "limits.max_steps": "30", "timeouts.kill_grace": "500ms"},
			[]string{"TIMEBOX_TOOL_TIMEOUT=90s", "TIMEBOX_MAX_STEPS=20", "TIMEBOX_KILL_GRACE=1s"},
			d(2*time.Minute, "flag", "--tool-timeout"), c(30, "flag", "--max-steps"),
			d(500*time.Millisecond, "flag", "--kill-grace"), 20 * time.Minute},
		{"flag beats default", withoutFile, map[string]string{"timeouts.tool": "2m"}, nil,
			d(2*time.Minute, "flag", "--tool-timeout"), c(25, "default", "limits.max_steps"),
			d(2*time.Second, "default", "timeouts.kill_grace"), 10 * time.Minute},
		{"last variable wins", withFile, nil, []string{"TIMEBOX_TOOL_TIMEOUT=90s", "TIMEBOX_TOOL_TIMEOUT=80s"},
			d(80*time.Second, "env", "TIMEBOX_TOOL_TIMEOUT"), c(10, "file", "limits.max_steps"),
			d(3*time.Second, "file", "timeouts.kill_grace"), 20 * time.Minute},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a, err := Load(writeAgent(t, tc.file), Overrides{Flags: tc.flags, Env: tc.env})
			if err != nil {
				t.Fatal(err)
			}
			if a.Budgets.Tool != tc.tool {
				t.Errorf("timeouts.tool %+v, want %+v", a.Budgets.Tool, tc.tool)
			}
			if a.Limits.MaxSteps != tc.maxSteps {
				t.Errorf("max_steps %+v, want %+v", a.Limits.MaxSteps, tc.maxSteps)
			}
			if a.Budgets.KillGrace != tc.killGrace {
				t.Errorf("kill_grace %+v, want %+v", a.Budgets.KillGrace, tc.killGrace)
			}
			byName := map[string]budget.ToolBudget{}
			for _, tl := range a.Tools {
				byName[tl.Name] = tl.Budget
				if tl.Budget.KillGrace.D != tc.killGrace.D {
					t.Errorf("%s: kill grace %v, want %v", tl.Name, tl.Budget.KillGrace.D, tc.killGrace.D)
				}
			}
			// A tool's own timeout and profile win over every layer.
			if got, want := byName["own"].Timeout, d(10*time.Second, "tool", "tools[own].timeout in agent.yaml"); got != want {
				t.Errorf("own: %+v, want %+v", got, want)
			}
			if got, want := byName["prof"].Timeout, d(tc.slow, "profile:slow", "tools[prof].timeout in agent.yaml"); got != want {
				t.Errorf("prof: %+v, want %+v", got, want)
			}
			if got := byName["custom"].Timeout; got.D != 7*time.Second {
				t.Errorf("custom: %+v", got)
			}
			if got, want := byName["fast"].Timeout, d(5*time.Second, "profile:fast", "tools[fast].timeout in agent.yaml"); got != want {
				t.Errorf("fast: %+v, want %+v", got, want)
			}
			// Without its own, a tool takes the process-wide value with its
			// source and knob.
			if got := byName["plain"].Timeout; got != tc.tool {
				t.Errorf("plain: %+v, want %+v", got, tc.tool)
			}
		})
	}
}

// TestEveryFlagAndVariable sets each setting by flag and by variable and
// checks that the value lands in the right field with the right knob.
func TestEveryFlagAndVariable(t *testing.T) {
	path := writeAgent(t, "model: {primary: 'script:demo'}\nproviders: {script: {file: script.jsonl}}\n")
	sample := map[SettingKind]struct {
		text string
		n    int64
	}{
		KindDuration: {"7m", int64(7 * time.Minute)},
		KindCount:    {"7", 7},
		KindBytes:    {"7KiB", 7 << 10},
		KindSwitch:   {"off", 0}, // the default is on
	}
	for _, s := range Settings {
		v := sample[s.Kind]
		a, err := Load(path, Overrides{Flags: map[string]string{s.Key: v.text}})
		if err != nil {
			t.Fatalf("%s: %v", s.Key, err)
		}
		n, src, knob := settingValue(a, s)
		if n != v.n || src != budget.SourceFlag || knob != "--"+s.Flag {
			t.Errorf("flag %s: %d %s %s", s.Flag, n, src, knob)
		}
		a, err = Load(path, Overrides{Env: []string{s.Env + "=" + v.text}})
		if err != nil {
			t.Fatalf("%s: %v", s.Env, err)
		}
		n, src, knob = settingValue(a, s)
		if n != v.n || src != budget.SourceEnv || knob != s.Env {
			t.Errorf("env %s: %d %s %s", s.Env, n, src, knob)
		}
	}
}

// TestSettingsTable checks the names the CLI registers.
func TestSettingsTable(t *testing.T) {
	want := map[string][2]string{
		"timeouts.tool":            {"tool-timeout", "TIMEBOX_TOOL_TIMEOUT"},
		"timeouts.tool_max":        {"tool-max", "TIMEBOX_TOOL_MAX"},
		"timeouts.llm_first_chunk": {"llm-first-chunk-timeout", "TIMEBOX_LLM_FIRST_CHUNK_TIMEOUT"},
		"timeouts.llm_idle":        {"llm-idle-timeout", "TIMEBOX_LLM_IDLE_TIMEOUT"},
		"timeouts.llm_budget":      {"llm-budget", "TIMEBOX_LLM_BUDGET"},
		"timeouts.step":            {"step-timeout", "TIMEBOX_STEP_TIMEOUT"},
		"timeouts.turn":            {"turn-timeout", "TIMEBOX_TURN_TIMEOUT"},
		"timeouts.progress_notice": {"progress-notice", "TIMEBOX_PROGRESS_NOTICE"},
		"timeouts.kill_grace":      {"kill-grace", "TIMEBOX_KILL_GRACE"},
		"timeouts.compaction":      {"compaction-timeout", "TIMEBOX_COMPACTION_TIMEOUT"},
		"timeouts.approval":        {"approval-timeout", "TIMEBOX_APPROVAL_TIMEOUT"},
		"limits.max_steps":         {"max-steps", "TIMEBOX_MAX_STEPS"},
		"limits.max_tool_calls":    {"max-tool-calls", "TIMEBOX_MAX_TOOL_CALLS"},
		"limits.parallel_tools":    {"parallel-tools", "TIMEBOX_PARALLEL_TOOLS"},
		"limits.max_tool_output":   {"max-tool-output", "TIMEBOX_MAX_TOOL_OUTPUT"},
		"limits.idle_breaker":      {"idle-breaker", "TIMEBOX_IDLE_BREAKER"},
		"limits.max_reply":         {"max-reply", "TIMEBOX_MAX_REPLY"},
		"context.compact_at":       {"compact-at", "TIMEBOX_COMPACT_AT"},
		"context.time_notes":       {"time-notes", "TIMEBOX_TIME_NOTES"},
		"server.shutdown_grace":    {"shutdown-grace", "TIMEBOX_SHUTDOWN_GRACE"},
	}
	if len(Settings) != len(want) {
		t.Errorf("%d settings, want %d", len(Settings), len(want))
	}
	for _, s := range Settings {
		w, ok := want[s.Key]
		if !ok || s.Flag != w[0] || s.Env != w[1] {
			t.Errorf("%s: flag %q env %q, want %q", s.Key, s.Flag, s.Env, w)
		}
		if s.Doc == "" || s.Default == "" || (s.Min <= 0 && s.Kind != KindSwitch) || s.Max < s.Min {
			t.Errorf("%s: incomplete: %+v", s.Key, s)
		}
		if got, ok := SettingByKey(s.Key); !ok || got.Key != s.Key {
			t.Errorf("SettingByKey(%q)", s.Key)
		}
	}
}

// TestAliases checks that anchors, aliases and merge keys work, and that
// top-level x- keys may hold them.
func TestAliases(t *testing.T) {
	t.Chdir(filepath.Join("testdata", "errors"))
	a, err := Load("aliases.yaml", Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if got := a.Tools[0].Budget.Timeout; got.D != 5*time.Second || got.Source != budget.SourceTool {
		t.Errorf("merged timeout %+v", got)
	}
}

// TestWarnings checks that an idle timeout that can never fire is a
// warning, and an unknown TIMEBOX_ variable too, with a suggestion.
func TestWarnings(t *testing.T) {
	path := writeAgent(t, "model: {primary: 'script:demo'}\nproviders: {script: {file: script.jsonl}}\ntools:\n  - {name: a, exec: [echo], timeout: 10s, idle_timeout: 10s}\n")
	a, err := Load(path, Overrides{Env: []string{"TIMEBOX_TURN_TIMOUT=5m"}})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		path + ":4:57: tools[0].idle_timeout: 10s is not shorter than the call's timeout (10s, from tools[a].timeout in agent.yaml), so it can never fire",
		"TIMEBOX_TURN_TIMOUT is not a timebox variable; it is ignored (did you mean TIMEBOX_TURN_TIMEOUT?)",
	}
	if !reflect.DeepEqual(a.Warnings, want) {
		t.Errorf("warnings\n got %q\nwant %q", a.Warnings, want)
	}
}

func TestDurationFix(t *testing.T) {
	for in, want := range map[string]string{
		"30":                "30s",
		"1.5":               "1.5s",
		"10 mins":           "10m",
		"10min":             "10m",
		"30S":               "30s",
		"1 hour 30 minutes": "1h30m",
		"1h 30m":            "1h30m",
		"2d":                "48h",
		"1.5 hrs":           "1.5h",
		"250 milliseconds":  "250ms",
		"abc":               "",
		"five minutes":      "",
		"10 parsecs":        "",
	} {
		got, ok := durationFix(in)
		if got != want || ok != (want != "") {
			t.Errorf("durationFix(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"1048576": 1 << 20, "1MiB": 1 << 20, "512KiB": 512 << 10, "1GiB": 1 << 30,
		"1024B": 1024, "2 mib": 2 << 20, "1KIB": 1024,
	} {
		got, problem := parseSize(value{text: in})
		if problem != "" || got != want {
			t.Errorf("parseSize(%q) = %d, %q; want %d", in, got, problem, want)
		}
	}
	for in, want := range map[string]string{
		"1MB":    `"1MB" is ambiguous (use 1MiB for 1048576 bytes, or 1000000)`,
		"512k":   `"512k" is ambiguous (use 512KiB for 524288 bytes, or 512000)`,
		"1.5MiB": `"1.5MiB" is not a whole number of bytes (use 1536KiB)`,
		"lots":   `"lots" is not a size (use bytes, or KiB, MiB or GiB, such as 1MiB)`,
		"1TiB":   `"1TiB" is not a size (use bytes, or KiB, MiB or GiB, such as 1MiB)`,
		"-1":     `"-1" is not a size (use bytes, or KiB, MiB or GiB, such as 1MiB)`,
	} {
		if _, problem := parseSize(value{text: in}); problem != want {
			t.Errorf("parseSize(%q): %q\nwant %q", in, problem, want)
		}
	}
}

func TestSuggest(t *testing.T) {
	keys := []string{"tool", "tool_max", "turn", "step", "profiles"}
	for in, want := range map[string]string{
		"tol": "tool", "tool_mx": "tool_max", "trun": "turn", "profile": "profiles", "x": "", "compaction_timeout": "",
	} {
		if got := suggest(in, keys); got != want {
			t.Errorf("suggest(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestErrorFormat(t *testing.T) {
	for _, c := range []struct {
		e    Error
		want string
	}{
		{Error{File: "a.yaml", Line: 3, Col: 9, Key: "timeouts.turn", Msg: "m"}, "a.yaml:3:9: timeouts.turn: m"},
		{Error{File: "a.yaml", Key: "model.primary", Msg: "m"}, "a.yaml: model.primary: m"},
		{Error{File: "a.yaml", Line: 1, Col: 1, Msg: "YAML syntax: x"}, "a.yaml:1:1: YAML syntax: x"},
		{Error{Key: "--tool-timeout", Msg: "m"}, "--tool-timeout: m"},
	} {
		if got := c.e.Error(); got != c.want {
			t.Errorf("%q, want %q", got, c.want)
		}
	}
}

// FuzzLoad feeds arbitrary bytes (and an arbitrary flag value) to the
// loader: it must never panic; every problem of the file must have the
// spec's file:line:col and a message; and an agent it returns must be
// usable. The corpus is testdata/fuzz/FuzzLoad and every file of testdata.
func FuzzLoad(f *testing.F) {
	seeds, _ := filepath.Glob(filepath.Join("testdata", "*", "*.yaml"))
	for _, s := range seeds {
		b, err := os.ReadFile(s)
		if err == nil {
			f.Add(b, "90s")
		}
	}
	f.Add([]byte("a: &x [*x, *x]\nb: *x\n"), "")
	f.Add([]byte("tools:\n  - name: a\n    exec: [x]\n    input_schema: &s {type: object, properties: {a: *s}}\n"), "1 min")
	f.Add([]byte("<<: {model: {primary: 'script:x'}}\n"), "-1s")
	f.Add([]byte("---\n---\n"), "0")
	f.Add([]byte("? [a]\n: 1\n"), "1h")
	dir := f.TempDir()
	path := filepath.Join(dir, "agent.yaml")
	f.Fuzz(func(t *testing.T, data []byte, flagValue string) {
		o := Overrides{Flags: map[string]string{budget.KeyTool: flagValue}, Env: []string{"TIMEBOX_TURN_TIMEOUT=" + flagValue}}
		a, err := newLoader(path, o).load(data)
		if err != nil {
			var es Errors
			if !errors.As(err, &es) || len(es) == 0 {
				t.Fatalf("not config.Errors: %v", err)
			}
			for _, e := range es {
				if e.Msg == "" || e.Line < 0 || e.Col < 0 {
					t.Fatalf("bad error %+v", *e)
				}
				if e.File == path && (e.Line < 1 || e.Col < 1 || !strings.HasPrefix(e.Error(), fmt.Sprintf("%s:%d:%d: ", path, e.Line, e.Col))) {
					t.Fatalf("a problem of the file without file:line:col: %q", e.Error())
				}
				if e.File == "" && e.Key == "" {
					t.Fatalf("a problem with neither a place nor a key: %q", e.Error())
				}
			}
			return
		}
		if a == nil {
			t.Fatal("nil agent without error")
		}
		if err := WriteTable(&bytes.Buffer{}, a); err != nil {
			t.Fatal(err)
		}
	})
}

func TestParseCount(t *testing.T) {
	for in, want := range map[string]string{
		"25":                   "",
		"1e3":                  `"1e3" is not written as a whole number (use 1000)`,
		"2.5":                  `"2.5" is not a whole number (use 3)`,
		"99999999999999999999": "", // past int64: the range check says the limit
		"many":                 `"many" is not a whole number`,
	} {
		if _, problem := parseCount(value{text: in}); problem != want {
			t.Errorf("parseCount(%q): %q, want %q", in, problem, want)
		}
	}
}

// TestRequestMax: server.request_max reads one ceiling per budget a request
// may set, in that budget's unit; a budget a request may not set, or a
// value out of the budget's bounds, is an error at its position.
func TestRequestMax(t *testing.T) {
	path := writeAgent(t, "model: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\nserver: {request_max: {turn: 2h, max_steps: 50}}\n")
	a, err := Load(path, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"turn": int64(2 * time.Hour), "max_steps": 50}
	if diff := cmp.Diff(want, a.Server.RequestMax); diff != "" {
		t.Errorf("request_max (-want +got):\n%s", diff)
	}
	if got, want := requestCeilings(a), "tool up to 60s, llm_budget any, step up to 5m, turn up to 2h (server.request_max.turn), max_steps up to 50 (server.request_max.max_steps), max_tool_calls up to 50"; got != want {
		t.Errorf("validate's request budgets:\n got %s\nwant %s", got, want)
	}
	for _, tc := range []struct{ body, says string }{
		{"server: {request_max: {kill_grace: 5s}}", "server.request_max.kill_grace"},
		{"server: {request_max: {turn: 8d}}", "server.request_max.turn"},
		{"server: {request_max: {max_steps: 0}}", "server.request_max.max_steps"},
	} {
		path := writeAgent(t, "model: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\n"+tc.body+"\n")
		if _, err := Load(path, Overrides{}); err == nil || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%s: err = %v, want one naming %s", tc.body, err, tc.says)
		}
	}
}

// TestRetries reads tools[].retries: 0 when absent, the number given.
func TestRetries(t *testing.T) {
	path := writeAgent(t, `model: {primary: script:m}
providers: {script: {file: script.jsonl}}
tools:
  - name: once
    exec: [true]
  - name: twice
    exec: [true]
    retries: 2
`)
	a, err := Load(path, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, tl := range a.Tools {
		got[tl.Name] = tl.Retries
	}
	if diff := cmp.Diff(map[string]int{"once": 0, "twice": 2}, got); diff != "" {
		t.Errorf("retries (-want +got):\n%s", diff)
	}
}

// TestFixCommandsWorkFromHere: the fix a problem with a tool's program
// suggests (chmod +x, sed) names it as a command run here can use: not
// as the agent file writes it, relative to the file's own directory.
func TestFixCommandsWorkFromHere(t *testing.T) {
	dir := t.TempDir() // not under the working directory
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"text": "a"}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "tool.sh"), []byte("#!/bin/sh\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "crlf.sh"), []byte("#!/bin/sh\r\necho\r\n"), 0o755)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte("model: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\ntools:\n  - {name: a, exec: [./tool.sh]}\n  - {name: b, exec: [./crlf.sh]}\n"), 0o644)
	_, err := Load(file, Overrides{})
	if err == nil || !strings.Contains(err.Error(), "(chmod +x "+filepath.Join(dir, "tool.sh")+")") ||
		!strings.Contains(err.Error(), "sed -i 's/\\r$//' "+filepath.Join(dir, "crlf.sh")+")") {
		t.Errorf("%v", err)
	}
}

// TestAWindowsPathSaysToUseSlashes: a program written with backslashes
// (".\tools\greet.sh") is said to need slashes, with the path meant, not
// looked up in PATH and suggested as "./tools/.\tools\greet.sh".
func TestAWindowsPathSaysToUseSlashes(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("backslashes are paths there")
	}
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"text": "a"}`+"\n"), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte("model: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\ntools:\n  - {name: a, exec: ['.\\tools\\greet.sh']}\n"), 0o644)
	_, err := Load(file, Overrides{Env: []string{"PATH=/usr/bin"}})
	if err == nil || !strings.Contains(err.Error(), `has backslashes: write paths with / (such as ./tools/greet.sh)`) {
		t.Errorf("%v", err)
	}
}
