package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/testenv"
)

// statsAgent is the agent of the stats tests: one turn calls quick 25
// times (its 5m budget is far above what it takes) and slow 20 times (it
// sleeps 2s under a 300ms budget, so every call is cut off).
const statsAgent = `# The agent of the stats test.
name: statstest
model:
  primary: script:m
providers:
  script: {file: script.jsonl}
limits: {max_tool_calls: 50, parallel_tools: 8}

tools:
  - name: quick   # answers at once
    exec: [./quick.sh]
    timeout: 5m   # far too long: stats --apply changes it

  - name: slow
    exec: [./slow.sh]
    timeout: 300ms
`

func statsDir(t *testing.T) (agentPath string) {
	t.Helper()
	dir := t.TempDir()
	var calls []string
	for range 25 {
		calls = append(calls, `{"name": "quick", "arguments": {}}`)
	}
	for range 20 {
		calls = append(calls, `{"name": "slow", "arguments": {}}`)
	}
	files := map[string]string{
		"agent.yaml":   statsAgent,
		"script.jsonl": `{"tool_calls": [` + strings.Join(calls, ", ") + `]}` + "\n" + `{"text": "done"}` + "\n",
		"quick.sh":     "#!/bin/sh\ncat >/dev/null\necho ok\n",
		"slow.sh":      "#!/bin/sh\ncat >/dev/null\nexec sleep 2\n",
	}
	for name, body := range files {
		mode := os.FileMode(0o644)
		if strings.HasSuffix(name, ".sh") {
			mode = 0o755
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), mode); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "agent.yaml")
}

// TestStats runs a turn into a real store (SQLite, then PostgreSQL) and
// reads its calls back: stats as text and JSON, validate's warnings, and
// --apply with and without --dry-run on the agent file.
func TestStats(t *testing.T) {
	for _, tc := range []struct {
		name string
		db   func(t *testing.T) string
	}{
		{"sqlite", func(t *testing.T) string { return filepath.Join(t.TempDir(), "timebox.db") }},
		{"postgres", func(t *testing.T) string { return testenv.Postgres(t) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			proctest.AfterTest(t)
			agent, db := statsDir(t), tc.db(t)
			if r := run(t, nil, "run", "-f", agent, "--db", db, "go"); r.code != 0 {
				t.Fatalf("run: exit %d\n%s%s", r.code, r.out, r.err)
			}

			r := run(t, nil, "stats", "-f", agent, "--db", db, "--json")
			if r.code != 0 {
				t.Fatalf("stats --json: exit %d\n%s", r.code, r.err)
			}
			var rep struct {
				Store string           `json:"store"`
				Tools []map[string]any `json:"tools"`
			}
			if err := json.Unmarshal([]byte(r.out), &rep); err != nil {
				t.Fatalf("stats --json is not JSON: %v\n%s", err, r.out)
			}
			tools := map[string]map[string]any{}
			for _, x := range rep.Tools {
				tools[x["tool"].(string)] = x
			}
			quick, slow := tools["quick"], tools["slow"]
			if quick == nil || quick["calls"] != 25.0 || quick["timeout_ms"] != 300000.0 || quick["timeout_source"] != "tool" ||
				quick["suggested_timeout_ms"] == nil || quick["timed_out"] != 0.0 {
				t.Errorf("quick: %v", quick)
			}
			if slow == nil || slow["calls"] != 20.0 || slow["timed_out"] != 20.0 || slow["p50_ms"].(float64) < 300 ||
				slow["suggested_timeout_ms"].(float64) < 1000 || !strings.Contains(r.out, `"calls_cut_off"`) {
				t.Errorf("slow: %v", slow)
			}
			for _, key := range []string{`"p95_ms"`, `"p99_ms"`, `"max_ms"`, `"overran"`, `"abandoned"`, `"cancelled"`, `"max_silence_ms"`,
				`"suggested_idle_timeout_ms"`, `"models"`, `"endpoint": "script:m"`, `"phase": "llm_first_chunk"`} {
				if !strings.Contains(r.out, key) {
					t.Errorf("stats --json lacks %s", key)
				}
			}

			if r := run(t, nil, "stats", "-f", agent, "--db", db); r.code != 0 || !strings.Contains(r.out, "SUGGEST") ||
				!strings.Contains(r.out, "slow: calls are being cut off: 20 of 20 (100.0%) were stopped by the timeout (300ms)") {
				t.Errorf("stats: exit %d\n%s%s", r.code, r.out, r.err)
			}
			if r := run(t, nil, "stats", "--db", db, "--tool", "quick", "--json"); r.code != 0 || strings.Contains(r.out, `"slow"`) ||
				!strings.Contains(r.out, `"models": []`) {
				t.Errorf("stats --tool quick: exit %d\n%s%s", r.code, r.out, r.err)
			}
			// A tool no call was ever recorded of is not "no calls": the
			// name is wrong, and the one meant, or those recorded, said.
			for _, c := range []struct{ tool, say string }{
				{"quik", `--tool: no call of a tool named "quik" was ever recorded in ` + db + ` (did you mean quick?)`},
				{"nosuch", `--tool: no call of a tool named "nosuch" was ever recorded in ` + db + ` (the tools recorded: quick, slow)`},
			} {
				if r := run(t, nil, "stats", "--db", db, "--tool", c.tool); r.code != 2 || r.out != "" || !strings.Contains(r.err, c.say) {
					t.Errorf("stats --tool %s: exit %d\n%s%s", c.tool, r.code, r.out, r.err)
				}
			}
			if r := run(t, nil, "stats", "--db", db, "--tool", "quick", "--since", "1ms"); r.code != 0 || !strings.Contains(r.out, "widen --since") {
				t.Errorf("stats --tool quick --since 1ms: exit %d\n%s%s", r.code, r.out, r.err)
			}

			r = run(t, nil, "validate", "-f", agent, "--db", db)
			if r.code != 0 ||
				!strings.Contains(r.err, "warning: tool slow: timeout 300ms (tools[slow].timeout in agent.yaml) is below ") ||
				!strings.Contains(r.err, "the p95 of its 20 calls since") ||
				!strings.Contains(r.err, "warning: tool quick: timeout 5m (tools[quick].timeout in agent.yaml) is more than 10 times the longest of its 25 calls") {
				t.Errorf("validate: exit %d\n%s", r.code, r.err)
			}

			before, _ := os.ReadFile(agent)
			r = run(t, nil, "stats", "--apply", "--dry-run", "-f", agent, "--db", db)
			if after, _ := os.ReadFile(agent); r.code != 0 || string(after) != string(before) ||
				!strings.Contains(r.out, "-    timeout: 5m   # far too long: stats --apply changes it\n+    timeout: ") ||
				!strings.Contains(r.out, "-    timeout: 300ms\n+    timeout: ") || !strings.Contains(r.err, "dry run") {
				t.Errorf("--apply --dry-run: exit %d, file changed %v\n%s%s", r.code, string(after) != string(before), r.out, r.err)
			}
			r = run(t, nil, "stats", "--apply", "-f", agent, "--db", db)
			after, _ := os.ReadFile(agent)
			if r.code != 0 || string(after) == string(before) {
				t.Fatalf("--apply: exit %d\n%s%s", r.code, r.out, r.err)
			}
			// Only the two timeout lines changed; comments and layout stay.
			b, a := strings.Split(string(before), "\n"), strings.Split(string(after), "\n")
			if len(a) != len(b) {
				t.Fatalf("--apply changed the number of lines:\n%s", after)
			}
			changed := 0
			for i := range b {
				if a[i] != b[i] {
					changed++
					if !strings.HasPrefix(strings.TrimSpace(a[i]), "timeout: ") {
						t.Errorf("--apply changed %q into %q", b[i], a[i])
					}
				}
			}
			if changed != 2 || !strings.Contains(string(after), "   # far too long: stats --apply changes it\n") {
				t.Errorf("--apply: %d lines changed:\n%s", changed, after)
			}
			if r := run(t, nil, "validate", "-f", agent, "--db", db); r.code != 0 || strings.Contains(r.err, "warning: tool") {
				t.Errorf("validate after --apply: exit %d\n%s", r.code, r.err)
			}
			if r := run(t, nil, "stats", "--apply", "-f", agent, "--db", db); r.code != 0 || r.out != "" || !strings.Contains(r.err, "nothing to change") {
				t.Errorf("--apply again: exit %d\n%s%s", r.code, r.out, r.err)
			}
		})
	}
}

// TestStatsUsage: what stats refuses, and a store that is not there.
func TestStatsUsage(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "none.db")
	for _, tc := range []struct {
		args []string
		code int
		say  string
	}{
		{[]string{"stats", "--db", missing}, 1, "no store at "},
		{[]string{"stats", "--db", missing, "--since", "last week"}, 2, `--since "last week"`},
		{[]string{"stats", "--db", missing, "--dry-run"}, 2, "--dry-run goes with --apply"},
		{[]string{"stats", "--db", missing, "web_fetch"}, 2, "--tool"},
	} {
		r := run(t, nil, tc.args...)
		if r.code != tc.code || !strings.Contains(r.err, tc.say) {
			t.Errorf("%s: exit %d\n%s", strings.Join(tc.args, " "), r.code, r.err)
		}
	}
	if _, err := os.Stat(missing); err == nil {
		t.Error("stats created a store")
	}
}

// TestValidateImpossibleBudget: a timeout under 10ms is a warning, with no
// store, and validate still exits 0; validate creates no store.
func TestValidateImpossibleBudget(t *testing.T) {
	agent := statsDir(t)
	b, _ := os.ReadFile(agent)
	os.WriteFile(agent, []byte(strings.Replace(string(b), "timeout: 300ms", "timeout: 5ms", 1)), 0o644)
	missing := filepath.Join(t.TempDir(), "none.db")
	r := run(t, []string{"TIMEBOX_DB=" + missing}, "validate", "-f", agent)
	if r.code != 0 || !strings.Contains(r.err, "warning: tool slow: timeout 5ms (tools[slow].timeout in agent.yaml) cannot be right") {
		t.Errorf("validate: exit %d\n%s", r.code, r.err)
	}
	if _, err := os.Stat(missing); err == nil {
		t.Error("validate created a store")
	}
}
