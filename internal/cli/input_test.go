package cli_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/testenv"
)

// runWithin runs the command and fails the test, rather than hang it, if
// it has not returned after d.
func runWithin(t *testing.T, d time.Duration, env []string, args ...string) result {
	t.Helper()
	done := make(chan result, 1)
	go func() { done <- run(t, env, args...) }()
	select {
	case r := <-done:
		return r
	case <-time.After(d):
		t.Fatalf("timebox %s did not return within %v", strings.Join(args, " "), d)
		return result{}
	}
}

// TestValidateRefusesWhatRunRefuses: validate and run load and build the
// agent by one code path, so each of these files is refused by both, with
// the same message and exit 2, and none of them blocks (a FIFO in place of
// the script used to hang run before any budget started).
func TestValidateRefusesWhatRunRefuses(t *testing.T) {
	noExec := filepath.Join(t.TempDir(), "tool.sh")
	if err := os.WriteFile(noExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		script string // the script file's content, or a path to use instead
		tools  string
		env    []string
		want   string
	}{
		{name: "unknown field in the script", script: `{"text": "a"}` + "\n" + `{"txt": "b"}`,
			want: `script.jsonl:2:2: txt: unknown field (did you mean text?)`},
		{name: "a bad duration in the script", script: `{"text": "a", "chunk_delay": "1 sec"}`,
			want: `script.jsonl:1:30: chunk_delay: "1 sec" is not a duration (use Go syntax like "50ms" or "2s")`},
		{name: "an empty script", script: "// nothing\n",
			want: `providers.script.file: "script.jsonl" has no lines`},
		{name: "/dev/zero as the script", script: "/dev/zero",
			want: `providers.script.file: "/dev/zero" is a character device, not a regular file`},
		{name: "a FIFO as the script", script: "fifo",
			want: `providers.script.file: "` + "FIFO" + `" is a named pipe (FIFO), not a regular file`},
		{name: "a program not in PATH", script: `{"text": "a"}`, tools: "tools: [{name: t, exec: [no-such-program-here]}]\n",
			env: []string{"PATH=/nonexistent"}, want: `tools[0].exec[0]: "no-such-program-here" is not found in PATH`},
		{name: "a program that is not executable", script: `{"text": "a"}`, tools: "tools: [{name: t, exec: [" + noExec + "]}]\n",
			want: `tools[0].exec[0]: "` + noExec + `" is not executable (chmod +x`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			file := "script.jsonl"
			switch c.script {
			case "/dev/zero":
				file = "/dev/zero"
			case "fifo":
				file = filepath.Join(dir, "FIFO")
				testenv.Mkfifo(t, file)
				c.want = strings.Replace(c.want, `"FIFO"`, `"`+file+`"`, 1)
			default:
				if err := os.WriteFile(filepath.Join(dir, file), []byte(c.script+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			agent := filepath.Join(dir, "agent.yaml")
			yaml := "model: {primary: 'script:m'}\nproviders: {script: {file: " + file + "}}\n" + c.tools
			if err := os.WriteFile(agent, []byte(yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			for _, args := range [][]string{{"validate", "-f", agent}, {"run", "-f", agent, "--no-store", "hi"}} {
				r := runWithin(t, 20*time.Second, c.env, args...)
				if r.code != 2 || !strings.Contains(r.err, c.want) {
					t.Errorf("%s: exit %d, want 2 and %q in\n%s", args[0], r.code, c.want, r.err)
				}
			}
		})
	}
}

// TestScriptProblemsAllAtOnce (issue 28): validate and run list every
// problem of the script, each at its line and column with its field and a
// fix, a cut-off last line included, after the agent file's own.
func TestScriptProblemsAllAtOnce(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "script.jsonl")
	os.WriteFile(script, []byte(`{"txt": "typo"}
{"text": "ok"}
{"chunks": ["a" "b"]}
{"text": "b", "first_chunk_delay": 50, "tool_calls": [{"name": "x", "delay": "1s"}]}
{"text": "done", "stall_after": `), 0o644)
	agent := filepath.Join(dir, "agent.yaml")
	os.WriteFile(agent, []byte("model: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\nlimits: {max_steps: 0}\n"), 0o644)
	want := []string{
		agent + `:3:21: limits.max_steps: 0 is below the minimum`,
		script + `:1:2: txt: unknown field (did you mean text?)`,
		script + `:3:17: chunks: invalid character '"' after array element (a comma or ] is missing before it)`,
		script + `:4:36: first_chunk_delay: 50 is not a duration (a duration is a string like "50ms")`,
		script + `:4:69: tool_calls[0].delay: unknown field (the fields of a call in tool_calls are arguments, name)`,
		script + `:5:32: stall_after: the line ends before its JSON value does — is it cut off?`,
		`6 problems; nothing was run.`,
	}
	for _, args := range [][]string{{"validate", "-f", agent}, {"run", "-f", agent, "--no-store", "hi"}} {
		r := runWithin(t, 20*time.Second, nil, args...)
		lines := strings.Split(strings.TrimSpace(r.err), "\n")
		if r.code != 2 || len(lines) != len(want) {
			t.Fatalf("%s: exit %d, want 2 and\n%s\ngot\n%s", args[0], r.code, strings.Join(want, "\n"), r.err)
		}
		for i, w := range want {
			if !strings.HasPrefix(lines[i], w) {
				t.Errorf("%s: line %d\n%s\nwant\n%s", args[0], i+1, lines[i], w)
			}
		}
	}
}

// TestValidateWarnsOfScriptCallsToMissingTools (issue 28): a script line
// that calls a tool the agent does not have is a warning of validate,
// placed at the call's name, with the agent's tools; validate still
// passes, as a script may call a missing tool on purpose.
func TestValidateWarnsOfScriptCallsToMissingTools(t *testing.T) {
	dir := t.TempDir()
	tool := filepath.Join(dir, "tool.sh")
	os.WriteFile(tool, []byte("#!/bin/sh\necho '{\"result\": \"ok\"}'\n"), 0o755)
	script := filepath.Join(dir, "script.jsonl")
	os.WriteFile(script, []byte(`{"text": "Let me look.", "tool_calls": [{"name": "search", "arguments": {"q": "x"}}]}
{"text": "ok"}
{"text": "a", "tool_calls": [{"name": "serch", "arguments": {}}, {"name": "fetch"}, {"name": "publish"}]}
{"text": "done"}
`), 0o644)
	agent := filepath.Join(dir, "agent.yaml")
	os.WriteFile(agent, []byte("model: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\n"+
		"tools:\n  - {name: search, exec: [./tool.sh]}\n  - {name: fetch, exec: [./tool.sh]}\n"), 0o644)
	r := run(t, nil, "validate", "-f", agent)
	want := "warning: " + script + `:3:39: tool_calls[0].name: "serch" is not a tool of this agent (did you mean search? its tools: search, fetch)` + "\n" +
		"warning: " + script + `:3:94: tool_calls[2].name: "publish" is not a tool of this agent (its tools: search, fetch)` + "\n"
	if r.code != 0 || r.err != want || !strings.Contains(r.out, ": ok") {
		t.Errorf("exit %d, want 0 with\n%s\ngot\n%s%s", r.code, want, r.err, r.out)
	}
}

// TestValidateRefusesHostileFiles is the "done when": the 40,000
// deep file, a 50 MB comment line and an alias bomb each exit 2 at once
// with a file:line:col message (the time and memory are measured by
// config.BenchmarkHostileFiles).
func TestValidateRefusesHostileFiles(t *testing.T) {
	dir := t.TempDir()
	head := "model: {primary: 'openai:x'}\n"
	bomb := head + "x-l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
	for i := 1; i < 9; i++ {
		bomb += "x-l" + string(rune('0'+i)) + ": &l" + string(rune('0'+i)) + " [" +
			strings.TrimSuffix(strings.Repeat("*l"+string(rune('0'+i-1))+", ", 9), ", ") + "]\n"
	}
	long := filepath.Join(dir, "long.yaml")
	f, err := os.Create(long)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(head + "# ")
	for range 50 {
		f.Write([]byte(strings.Repeat("x", 1<<20)))
	}
	f.Close()
	deep := filepath.Join(dir, "deep.yaml")
	os.WriteFile(deep, []byte(head+"x-a: "+strings.Repeat("[", 40000)+strings.Repeat("]", 40000)+"\n"), 0o644)
	laughs := filepath.Join(dir, "laughs.yaml")
	os.WriteFile(laughs, []byte(bomb), 0o644)
	for path, want := range map[string]string{
		deep:   `deep.yaml:2:105: x-a: nests more than 100 levels deep`,
		long:   `long.yaml:2:1048548: the file is larger than 1 MiB`,
		laughs: `laughs.yaml:6:12: x-l4[0]: aliases stand for more than 10000 values in all`,
	} {
		r := runWithin(t, 20*time.Second, nil, "validate", "-f", path)
		if r.code != 2 || !strings.Contains(r.err, want) {
			t.Errorf("%s: exit %d, want 2 and %q in\n%s", filepath.Base(path), r.code, want, r.err)
		}
	}
}

func TestServeRefusesABlankToken(t *testing.T) {
	file := agentFile(t, `{"text": "hi"}`)
	for _, c := range []struct {
		env  []string
		args []string
		want string
	}{
		{[]string{"TIMEBOX_TOKEN="}, nil, "timebox serve: TIMEBOX_TOKEN is empty: it would serve without a token"},
		{[]string{"TIMEBOX_TOKEN=   "}, nil, "timebox serve: TIMEBOX_TOKEN is only whitespace"},
		{[]string{"TIMEBOX_TOKEN=a secret token with spaces"}, nil, "TIMEBOX_TOKEN holds whitespace or a control character"},
		{nil, []string{"--token", ""}, "timebox serve: --token is empty"},
		{[]string{"TIMEBOX_TOKEN=a-good-long-token-value"}, []string{"--token", " "}, "--token is only whitespace"},
	} {
		// runWithin: should the token be taken, serve would serve.
		r := runWithin(t, 20*time.Second, c.env, append([]string{"serve", "-f", file, "--addr", "127.0.0.1:0", "--db", ""}, c.args...)...)
		if r.code != 2 || !strings.Contains(r.err, c.want) {
			t.Errorf("%v %v: exit %d, want 2 and %q in\n%s", c.env, c.args, r.code, c.want, r.err)
		}
	}
	// A short token is served with a warning; the bad address stops serve
	// before it serves.
	r := run(t, []string{"TIMEBOX_TOKEN=short"}, "serve", "-f", file, "--addr", "nonsense", "--db", "")
	if !strings.Contains(r.err, "warning: TIMEBOX_TOKEN is shorter than 16 characters; a short token can be guessed") {
		t.Errorf("no warning for a short token:\n%s", r.err)
	}
}

func TestToolCallInputMustBeAJSONObject(t *testing.T) {
	for input, want := range map[string]string{
		"text: hi": `--input "text: hi": it is not JSON: invalid character`,
		"[1, 2]":   `--input "[1, 2]": it is JSON, but not an object`,
		"null":     `--input "null": it is JSON, but not an object`,
		"":         `--input "": it is not JSON: unexpected end of JSON input`,
	} {
		r := run(t, nil, "tool", "call", "word_count", "-f", demo, "--input", input)
		if r.code != 2 || !strings.Contains(r.err, want) || r.out != "" {
			t.Errorf("--input %q: exit %d, want 2 and %q in\n%s%s", input, r.code, want, r.out, r.err)
		}
	}
	long := "x" + strings.Repeat("y", 10000)
	r := run(t, nil, "tool", "call", "word_count", "-f", demo, "--input", long)
	if r.code != 2 || len(r.err) > 400 || !regexp.MustCompile(`"xy+…"`).MatchString(r.err) {
		t.Errorf("a long --input is quoted whole or not cut: exit %d, %d bytes", r.code, len(r.err))
	}
}
