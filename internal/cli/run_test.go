package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/cli"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/sqlite"
)

const demo = "../../examples/demo/agent.yaml"

// events parses JSON-lines output, failing on any line that is not an event.
func events(t *testing.T, out string) []event.Event {
	t.Helper()
	var evs []event.Event
	sc := bufio.NewScanner(strings.NewReader(out))
	sc.Buffer(nil, 1<<22)
	for sc.Scan() {
		var e event.Event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Type == "" {
			t.Fatalf("stdout line is not an event: %q (%v)", sc.Text(), err)
		}
		evs = append(evs, e)
	}
	return evs
}

// TestDemo runs the README's main command and checks what it promises: all
// five tool behaviours, in the records.
func TestDemo(t *testing.T) {
	proctest.AfterTest(t)
	start := time.Now()
	r := run(t, nil, "run", "-f", demo, "--json", "--no-store", "Tour the budgets")
	if r.code != 0 {
		t.Fatalf("exit %d\nstderr: %s", r.code, r.err)
	}
	evs := events(t, r.out)
	got := map[string]*event.ToolFinished{}
	var fin *event.TurnFinished
	for _, e := range evs {
		switch d := e.Data.(type) {
		case *event.ToolFinished:
			got[d.Tool] = d
		case *event.TurnFinished:
			fin = d
		}
	}
	if fin == nil || fin.StopReason != "answered" {
		t.Fatalf("turn finished %+v", fin)
	}
	check := func(name string, ok bool) {
		t.Helper()
		if !ok {
			t.Errorf("%s: %+v", name, got[name])
		}
	}
	check("word_count", got["word_count"] != nil && got["word_count"].Outcome == "ok" && got["word_count"].TimeoutSource == "profile:fast" &&
		strings.HasPrefix(got["word_count"].Result, "{\"words\": 6}\n[timebox: took ") && strings.HasSuffix(got["word_count"].Result, " of 5s]"))
	check("crawl", got["crawl"] != nil && got["crawl"].Outcome == "ok" && got["crawl"].ProgressCount == 8 && got["crawl"].IdleTimeoutMS == 2000)
	check("web_fetch", got["web_fetch"] != nil && got["web_fetch"].Outcome == "timed_out" && got["web_fetch"].Phase == "tool" &&
		got["web_fetch"].DurationMS >= 1000 && got["web_fetch"].DurationMS < 2500 && strings.Contains(got["web_fetch"].Result, `"type":"tool_timeout"`) &&
		strings.Contains(got["web_fetch"].Result, "partial: resolving host"))
	check("legacy_sync", got["legacy_sync"] != nil && got["legacy_sync"].Outcome == "timed_out" &&
		got["legacy_sync"].DurationMS >= 2000 && got["legacy_sync"].DurationMS < 3500)
	check("report", got["report"] != nil && got["report"].Outcome == "ok" && got["report"].Overran && got["report"].Enforcement == "advisory" &&
		strings.Contains(got["report"].Result, "0 results lost"))
	if d := time.Since(start); d > time.Minute {
		t.Errorf("the demo took %s", d)
	}
}

func TestPlainViewAndExitCodes(t *testing.T) {
	proctest.AfterTest(t)
	r := run(t, nil, "run", "-f", demo, "--no-store", "Tour the budgets")
	// Durations read as in the agent file and validate: 60s, 2m, not 1m0s.
	for _, want := range []string{"budgets: tool 60s, step 5m, turn 2m, llm_idle 2m", "web_fetch started (timeout 1s from tool, hard)",
		"timed out: stopped, the model was told", "web_fetch", "overran its budget (advisory): result used", "8 progress reports", "✔ answered"} {
		if !strings.Contains(r.out, want) {
			t.Errorf("plain output lacks %q:\n%s", want, r.out)
		}
	}
	if strings.Contains(r.out, "\x1b[") {
		t.Error("plain output has terminal escapes")
	}
	checkReadmeSample(t, r.out)

	failing := agentFile(t, `{"error": {"status": 503, "message": "down"}}`)
	if r := run(t, nil, "run", "-f", failing, "--no-store", "hi"); r.code != 1 || !strings.Contains(r.out, "model_unavailable") {
		t.Errorf("failed turn: exit %d\n%s", r.code, r.out)
	}
	stalling := agentFile(t, `{"text": "x", "stall_after": 0}`)
	if r := run(t, nil, "run", "-f", stalling, "--no-store", "--llm-first-chunk-timeout", "0", "--turn-timeout", "300ms", "hi"); r.code != 3 ||
		!strings.Contains(r.out, "turn_timeout") || !strings.Contains(r.out, "raise --turn-timeout") {
		t.Errorf("stopped turn: exit %d\n%s%s", r.code, r.out, r.err)
	}
}

// Every command answers -h and --help with its usage and exit 0.
func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{{"run"}, {"validate"}, {"serve"}, {"tool"}, {"tool", "call"}, {"runs"}, {"runs", "list"},
		{"runs", "show"}, {"runs", "export"}, {"stats"}, {"mcp"}, {"mcp", "serve"}, {"worker"}, {"schema"}, {"version"}, {"help"}} {
		for _, h := range []string{"-h", "--help"} {
			r := run(t, nil, append(args, h)...)
			if r.code != 0 || r.out+r.err == "" {
				t.Errorf("timebox %s %s: exit %d, nothing printed: %q %q", strings.Join(args, " "), h, r.code, r.out, r.err)
			}
		}
	}
	if r := run(t, nil, "run", "--no-such-flag"); r.code != 2 {
		t.Errorf("an unknown flag: exit %d", r.code)
	}
}

// TestHelpStartsWithUsage: every command's -h starts with its usage line,
// "usage: timebox COMMAND ...", before its flags (mcp serve's had only the
// flag package's "Usage of timebox mcp serve:").
func TestHelpStartsWithUsage(t *testing.T) {
	for _, args := range [][]string{{"run"}, {"validate"}, {"serve"}, {"tool", "call"}, {"runs", "list"},
		{"runs", "show"}, {"runs", "export"}, {"stats"}, {"mcp", "serve"}, {"worker"}, {"schema"}} {
		r := run(t, nil, append(args, "-h")...)
		got := strings.TrimLeft(r.out+r.err, "\n")
		if r.code != cli.ExitOK || !strings.HasPrefix(got, "usage:") || !strings.Contains(got, "timebox "+strings.Join(args, " ")) {
			t.Errorf("timebox %s -h: exit %d, want a usage line first, got\n%s", strings.Join(args, " "), r.code, got)
		}
	}
}

// TestAFlagErrorIsShort: a flag error prints the error, the flag meant
// when one is near, and where the others are, in three lines — not every
// flag, which scrolled the error out of sight; -h still prints them all.
func TestAFlagErrorIsShort(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", "--adr", ":1"}, "flag provided but not defined: -adr\nDid you mean --addr?\nRun 'timebox serve -h' for its flags.\n"},
		{[]string{"run", "--agent", "a.yaml", "hi"}, "flag provided but not defined: -agent\nDid you mean -f?\nRun 'timebox run -h' for its flags.\n"},
		{[]string{"runs", "list", "--jsn"}, "flag provided but not defined: -jsn\nDid you mean --json?\nRun 'timebox runs list -h' for its flags.\n"},
		{[]string{"run", "--zzzzzz", "hi"}, "flag provided but not defined: -zzzzzz\nRun 'timebox run -h' for its flags.\n"},
		{[]string{"stats", "--since"}, "flag needs an argument: -since\nRun 'timebox stats -h' for its flags.\n"},
	} {
		r := run(t, nil, c.args...)
		if r.code != cli.ExitUsage || r.err != c.want || r.out != "" {
			t.Errorf("timebox %s: exit %d, stderr\n%s\nwant\n%s", strings.Join(c.args, " "), r.code, r.err, c.want)
		}
	}
	if r := run(t, nil, "serve", "-h"); r.code != cli.ExitOK || !strings.Contains(r.out+r.err, "-shutdown-grace") {
		t.Errorf("serve -h: exit %d, %s", r.code, r.out+r.err)
	}
}

func TestConfigurationErrorsExit2(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "agent.yaml")
	os.WriteFile(bad, []byte("model:\n  primary: script:m\ntimeouts:\n  tol: 5s\n  turn: 10 mins\n"), 0o644)
	r := run(t, nil, "run", "-f", bad, "--no-store", "hi")
	if r.code != 2 || !strings.Contains(r.err, `agent.yaml:4:3: timeouts.tol: unknown key`) ||
		!strings.Contains(r.err, `agent.yaml:5:9: timeouts.turn: "10 mins" is not a duration (use 10m)`) {
		t.Fatalf("exit %d\n%s", r.code, r.err)
	}
	lacking := "job" // a process-tree strategy this platform does not have
	if runtime.GOOS == "windows" {
		lacking = "track"
	}
	for _, env := range []string{"TIMEBOX_TOOL_TIMEOUT=abc", "TIMEBOX_MAX_STEPS=-1", "TIMEBOX_PROCTREE=magic", "TIMEBOX_PROCTREE=" + lacking} {
		r := run(t, []string{env}, "validate", "-f", demo)
		name := strings.SplitN(env, "=", 2)[0]
		if r.code != 2 || !strings.Contains(r.err, name) {
			t.Errorf("%s: exit %d\n%s", env, r.code, r.err)
		}
	}
	if r := run(t, nil, "run", "-f", demo, "--tool-timeout", "soon", "hi"); r.code != 2 || !strings.Contains(r.err, "--tool-timeout") {
		t.Errorf("bad flag: exit %d\n%s", r.code, r.err)
	}
	if r := run(t, nil, "frobnicate"); r.code != 2 {
		t.Errorf("unknown command: exit %d", r.code)
	}
}

func TestValidatePrintsSources(t *testing.T) {
	r := run(t, []string{"TIMEBOX_TOOL_TIMEOUT=90s", "TIMEBOX_STEP_TIMEOUT=2m"}, "validate", "-f", demo, "--tool-timeout", "2m")
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.err)
	}
	for _, re := range []string{`timeouts.tool\s+2m\s+flag\s+--tool-timeout`, `timeouts.step\s+2m\s+env\s+TIMEBOX_STEP_TIMEOUT`,
		`timeouts.turn\s+2m\s+file`, `timeouts.llm_idle\s+2m\s+default`, `word_count\s+exec\s+5s\s+profile:fast`, `report\s+exec\s+1s\s+tool\s+off\s+advisory`} {
		if !regexpMatch(re, r.out) {
			t.Errorf("validate output lacks /%s/:\n%s", re, r.out)
		}
	}
}

// TestValidateShowsInheritance: validate says, by name, what each tool
// inherits of timebox's environment — its env:, or everything but the
// secrets timebox withholds — and never a value.
func TestValidateShowsInheritance(t *testing.T) {
	r := run(t, []string{"TIMEBOX_TOKEN=s3cret-token-value"}, "validate", "-f", demo)
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.err)
	}
	for _, re := range []string{`word_count\s+everything but ANTHROPIC_API_KEY, OPENAI_API_KEY, OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_TRACES_HEADERS, PGPASSFILE, PGPASSWORD, PGSSLPASSWORD, TIMEBOX_DB, TIMEBOX_TOKEN`, `report\s+PATH\n`} {
		if !regexpMatch(re, r.out) {
			t.Errorf("validate output lacks /%s/:\n%s", re, r.out)
		}
	}
	if strings.Contains(r.out, "s3cret") {
		t.Errorf("validate shows a value:\n%s", r.out)
	}
}

func TestToolCall(t *testing.T) {
	proctest.AfterTest(t)
	r := run(t, nil, "tool", "call", "web_fetch", "-f", demo, "--input", `{"url": "https://x"}`)
	var rec event.ToolCall
	if err := json.Unmarshal([]byte(r.out), &rec); err != nil {
		t.Fatalf("%v\n%s", err, r.out)
	}
	if r.code != 3 || rec.Outcome != "timed_out" || rec.TimeoutMS != 1000 || rec.TimeoutSource != "tool" {
		t.Fatalf("exit %d, record %+v", r.code, rec)
	}
	// Outside a turn there is no model: the person calling is told.
	if !strings.Contains(r.err, "timed out: stopped, the caller was told") || strings.Contains(r.err, "model") {
		t.Fatalf("tool call output: %s", r.err)
	}
	r = run(t, nil, "tool", "call", "word_count", "-f", demo, "--input", `{"text": "one two"}`)
	if r.code != 0 || !strings.Contains(r.out, `"outcome": "ok"`) {
		t.Fatalf("exit %d\n%s", r.code, r.out)
	}
	// Its result is the tool's output, as the tool wrote it: the time
	// note is for a model, and no model reads it here.
	rec = event.ToolCall{}
	if err := json.Unmarshal([]byte(r.out), &rec); err != nil || rec.Result != "{\"words\": 2}\n" {
		t.Fatalf("result %q, %v", rec.Result, err)
	}
	if r := run(t, nil, "tool", "call", "nope", "-f", demo); r.code != 2 || !strings.Contains(r.err, "word_count") {
		t.Fatalf("unknown tool: exit %d %s", r.code, r.err)
	}
}

func TestRecordThenReplay(t *testing.T) {
	live := agentFile(t, `{"chunks": ["re", "corded"], "first_chunk_delay": "200ms", "chunk_delay": "50ms"}`)
	rec := filepath.Join(t.TempDir(), "incident.jsonl")
	if r := run(t, nil, "run", "-f", live, "--no-store", "--record", rec, "hi"); r.code != 0 {
		t.Fatalf("exit %d %s", r.code, r.err)
	}
	b, err := os.ReadFile(rec)
	if err != nil || !strings.Contains(string(b), `"first_chunk_delay":"20`) {
		t.Fatalf("recording %s (%v)", b, err)
	}
	replay := agentFile(t, strings.TrimSpace(string(b)))
	r := run(t, nil, "run", "-f", replay, "--no-store", "--json", "hi")
	var answer string
	for _, e := range events(t, r.out) {
		if f, ok := e.Data.(*event.TurnFinished); ok {
			answer = f.Answer
		}
	}
	if answer != "recorded" {
		t.Fatalf("replayed answer %q", answer)
	}
}

// TestCtrlC runs the real binary, interrupts it while a tool hangs, and
// checks the exit code, the message, and that no process of the call is
// left.
func TestCtrlC(t *testing.T) {
	bin := timeboxBinary(t)
	dir := t.TempDir()
	pidfile := filepath.Join(dir, "pids")
	os.WriteFile(filepath.Join(dir, "hang.sh"), []byte("#!/usr/bin/env bash\ncat >/dev/null\ntrap '' TERM\nsetsid sleep 300 &\necho $! >> "+pidfile+"\necho $$ >> "+pidfile+"\nwhile true; do sleep 1; done\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"tool_calls": [{"name": "hang"}]}`+"\n"+`{"text": "never"}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "agent.yaml"), []byte("model: {primary: script:m}\nproviders: {script: {file: script.jsonl}}\ntools:\n  - name: hang\n    exec: [./hang.sh]\n    timeout: 5m\n"), 0o644)

	cmd := exec.Command(bin, "run", "-f", filepath.Join(dir, "agent.yaml"), "--no-store", "--json", "go")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	if !wait.Until(10*time.Second, func() bool { return strings.Count(readFile(pidfile), "\n") >= 2 }) {
		cmd.Process.Kill()
		t.Fatalf("the tool never started\n%s%s", out.String(), errb.String())
	}
	cmd.Process.Signal(syscall.SIGINT)
	err := cmd.Wait()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	if code != 130 || !strings.Contains(out.String(), `"stop_reason":"cancelled"`) || !strings.Contains(out.String(), "Cancelled by you (Ctrl-C)") ||
		!strings.Contains(out.String(), "tool hang was stopped") {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	for _, f := range strings.Fields(readFile(pidfile)) {
		if alive(f) {
			t.Errorf("process %s of the cancelled call is still alive", f)
		}
	}
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// alive reports whether pid is a live process (a zombie is not).
func alive(pid string) bool {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || len(s) < i+3 || s[i+2] != 'Z'
}

func regexpMatch(re, s string) bool { return regexp.MustCompile(re).MatchString(s) }

// `timebox run … | head -1`: when the reader of standard output goes away,
// the next write fails and the turn is cancelled as client_gone, its tools
// stopped and its record stored. Killed by SIGPIPE, as Go kills a program
// that writes to a broken stdout unless it asks for the signal, timebox
// left its tools running for ever.
// TestStdoutReaderGoesAway: the reader of `timebox run`'s standard output
// (a pipe) goes away mid-tool. With a still_working notice every 200ms
// timebox learns it from its next write (EPIPE); with the tool silent and
// nothing to write for minutes, from the pipe itself (watchReader).
func TestStdoutReaderGoesAway(t *testing.T) {
	for _, notice := range []string{"200ms", "10m"} {
		t.Run("progress-notice "+notice, func(t *testing.T) { stdoutReaderGoesAway(t, notice) })
	}
}

func stdoutReaderGoesAway(t *testing.T, notice string) {
	bin := timeboxBinary(t)
	dir := t.TempDir()
	pidfile := filepath.Join(dir, "pids")
	os.WriteFile(filepath.Join(dir, "hang.sh"), []byte("#!/usr/bin/env bash\ncat >/dev/null\ntrap '' TERM\nsetsid sleep 300 &\necho $! >> "+pidfile+"\necho $$ >> "+pidfile+"\nwhile true; do sleep 1; done\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"tool_calls": [{"name": "hang"}]}`+"\n"+`{"text": "never"}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "agent.yaml"), []byte("model: {primary: script:m}\nproviders: {script: {file: script.jsonl}}\ntools:\n  - name: hang\n    exec: [./hang.sh]\n    timeout: 5m\n"), 0o644)
	db := filepath.Join(dir, "timebox.db")

	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "run", "-f", filepath.Join(dir, "agent.yaml"), "--db", db, "--progress-notice", notice, "--json", "go")
	var errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = w, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	if !wait.Until(10*time.Second, func() bool { return strings.Count(readFile(pidfile), "\n") >= 2 }) {
		cmd.Process.Kill()
		t.Fatalf("the tool never started\n%s", errb.String())
	}
	r.Close() // the reader goes away, as head does after its first line
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("timebox did not end within 20s after its reader went away\n%s", errb.String())
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != cli.ExitCancelled {
		t.Fatalf("exit: %v (want code %d; a death by SIGPIPE reads 'signal: broken pipe')\n%s", err, cli.ExitCancelled, errb.String())
	}
	for _, f := range strings.Fields(readFile(pidfile)) {
		if alive(f) {
			t.Errorf("process %s of the call outlived the turn", f)
		}
	}
	st, err := sqlite.Open(db, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	list, err := st.Turns(context.Background(), store.Filter{})
	if err != nil || len(list) != 1 {
		t.Fatalf("stored turns %+v, %v", list, err)
	}
	if s := list[0]; s.StopReason != budget.ClientGone || !strings.Contains(s.Message, "the reader of standard output went away") ||
		!strings.Contains(s.Message, "tool hang was stopped") {
		t.Fatalf("stored turn %s: %s", s.StopReason, s.Message)
	}
}

// TestToolsDoNotInheritSecrets: a tool without env: that prints its
// environment shows the machine's variables but none of timebox's secrets:
// its token, its database URL, its providers' keys.
func TestToolsDoNotInheritSecrets(t *testing.T) {
	proctest.AfterTest(t)
	t.Setenv("TIMEBOX_TOKEN", "tok-s3cret")
	t.Setenv("TIMEBOX_DB", "postgres://u:pw-s3cret@db.invalid/tb")
	t.Setenv("OPENAI_API_KEY", "sk-s3cret")
	t.Setenv("PGSSLPASSWORD", "key-s3cret")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=collector-s3cret")
	t.Setenv("TB_PLAIN", "plain-value")
	file := agentFile(t, `{"tool_calls": [{"name": "printenv", "arguments": {}}]}`, `{"text": "done"}`)
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	yaml := string(b) + "  openai: {credentials: [{api_key_env: OPENAI_API_KEY}]}\n" +
		"tools:\n  - name: printenv\n    description: Prints its environment.\n    exec: [env]\n"
	if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	r := run(t, nil, "run", "-f", file, "--no-store", "--json", "go")
	if r.code != 0 || !strings.Contains(r.out, "plain-value") {
		t.Fatalf("exit %d; the tool's output lacks the machine's variables\n%s\n%s", r.code, r.out, r.err)
	}
	if strings.Contains(r.out, "s3cret") {
		t.Errorf("a secret reached the tool:\n%s", r.out)
	}
}

var (
	sampleTurnID = regexp.MustCompile(`\bt_[A-Z2-7]{26}\b`)
	sampleFigure = regexp.MustCompile(`\d+(\.\d+)?(ms|s)\b`)
	sampleSpaces = regexp.MustCompile(` {2,}`)
	stillWorking = regexp.MustCompile(`^… still working: (legacy_sync|report) #(, (legacy_sync|report) #)? \(no progress for #\)$`)
)

// sampleShape is a line of the plain view with what changes from run to
// run taken out: the turn id, the measured figures, the alignment.
func sampleShape(line string) string {
	line = sampleTurnID.ReplaceAllString(line, "t_ID")
	line = sampleFigure.ReplaceAllString(line, "#")
	return sampleSpaces.ReplaceAllString(line, " ")
}

// checkReadmeSample checks the README's sample of the demo's plain view
// against a real run of it: the same lines, in any order (the tools run
// at once), but for the measured figures and the turn id, which must have
// its real form. The "still working" notice is checked for its form only:
// whether it names legacy_sync, killed at about the same instant, is a
// race; crawl, which reports progress all along, it never names.
func checkReadmeSample(t *testing.T, out string) {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	const cmd = "$ timebox run -f examples/demo/agent.yaml \"Tour the budgets\"\n"
	_, sample, ok := strings.Cut(string(b), cmd)
	if !ok {
		t.Fatal("the README has no sample of the demo's output")
	}
	sample, _, _ = strings.Cut(sample, "```")
	count := func(text string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
			if sh := sampleShape(l); stillWorking.MatchString(sh) {
				m["still working"] = 1
			} else {
				m[sh]++
			}
		}
		return m
	}
	doc, real := count(sample), count(out)
	for l, n := range doc {
		if real[l] != n {
			t.Errorf("the README's sample of the demo has %d of %q, a real run %d", n, l, real[l])
		}
	}
	for l, n := range real {
		if doc[l] == 0 {
			t.Errorf("a real run of the demo prints %d of %q, which the README's sample lacks", n, l)
		}
	}
	if !sampleTurnID.MatchString(sample) {
		t.Error("the README's sample shows no turn id of the real form")
	}
}

// TestServeOnlyFlags: a flag only serve reads is not offered by run (whose
// help would otherwise list a setting that does nothing there), but is by
// serve, and by validate, which checks it.
func TestServeOnlyFlags(t *testing.T) {
	for _, c := range []struct {
		cmd  string
		want bool
	}{{"run", false}, {"tool", false}, {"serve", true}, {"validate", true}} {
		args := []string{c.cmd, "-h"}
		if c.cmd == "tool" {
			args = []string{"tool", "call", "-h"}
		}
		r := run(t, nil, args...)
		if got := strings.Contains(r.out+r.err, "-shutdown-grace"); got != c.want {
			t.Errorf("timebox %s -h lists -shutdown-grace: %v, want %v", c.cmd, got, c.want)
		}
	}
	if r := run(t, nil, "run", "-f", demo, "--no-store", "--shutdown-grace", "1s", "hi"); r.code != cli.ExitUsage {
		t.Errorf("run --shutdown-grace: exit %d, want %d", r.code, cli.ExitUsage)
	}
}

// TestHelpSaysWhatBudgetFlagsDo: a command's -h lists its own flags
// first and the budget flags under a heading that says what they do there
// (mcp serve has no turn; stats only reads some), validate -h says what it
// does, and runs -h says --db takes a postgres:// URL too.
func TestHelpSaysWhatBudgetFlagsDo(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"validate", "-h"}, []string{"usage: timebox validate", "Checks the agent file", "validate resolves them as run would"}},
		{[]string{"mcp", "serve", "-h"}, []string{"only the tools' apply", "there is no turn:\n  -approval-timeout"}},
		{[]string{"stats", "-h"}, []string{"the others do nothing here:\n  -approval-timeout"}},
		{[]string{"run", "-h"}, []string{"Budget flags (flag > TIMEBOX_* > agent file > default):\n",
			// what it does and its exit codes; each budget flag's default
			"Runs one turn", "Exit 0 completed, 1 failed, 2 usage or configuration error, 3 stopped by a\nbudget, 130 cancelled",
			"(timeouts.turn, default 30m; env TIMEBOX_TURN_TIMEOUT)", "(timeouts.llm_budget, default off; env TIMEBOX_LLM_BUDGET)",
			"  -approve TOOL\n"}},
		{[]string{"runs", "list", "-h"}, []string{"the store: a SQLite file or a postgres:// URL"}},
	} {
		r := run(t, nil, c.args...)
		got := r.out + r.err
		for _, w := range c.want {
			if r.code != cli.ExitOK || !strings.Contains(got, w) {
				t.Errorf("timebox %s: exit %d, want %q in\n%s", strings.Join(c.args, " "), r.code, w, got)
			}
		}
		// Its own flags come before the budget flags.
		if i, j := strings.Index(got, "  -f string"), strings.Index(got, "  -turn-timeout"); c.args[0] != "runs" && (i < 0 || j < i) {
			t.Errorf("timebox %s: -f at %d, -turn-timeout at %d: want the command's own flags first", strings.Join(c.args, " "), i, j)
		}
	}
}

// TestMissingAgentFileMentionsF: with no -f and no agent.yaml here, the
// error says how to name one; with -f naming a missing file, it does not
// pretend the user forgot the flag.
func TestMissingAgentFileMentionsF(t *testing.T) {
	if _, err := os.Stat("agent.yaml"); err == nil {
		t.Skip("this directory has an agent.yaml")
	}
	r := run(t, nil, "validate")
	if r.code != cli.ExitUsage || !strings.Contains(r.err, "agent.yaml: the agent file does not exist") ||
		!strings.Contains(r.err, "name an agent file with -f FILE") {
		t.Errorf("validate with no agent.yaml: exit %d\n%s", r.code, r.err)
	}
	r = run(t, nil, "validate", "-f", filepath.Join(t.TempDir(), "missing.yaml"))
	if r.code != cli.ExitUsage || strings.Contains(r.err, "No -f was given") {
		t.Errorf("validate -f missing.yaml: exit %d\n%s", r.code, r.err)
	}
}

// TestValidateShowsApprovals: validate lists the tools whose calls wait
// for a person's decision, with how long, the source and the knob, and
// timeouts.approval with its own; a bad approval stops it at its line.
func TestValidateShowsApprovals(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "tool.sh"), []byte("#!/bin/sh\necho ok\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"text": "ok"}`+"\n"), 0o644)
	agent := filepath.Join(dir, "agent.yaml")
	os.WriteFile(agent, []byte("model: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\ntools:\n"+
		"  - {name: plain, exec: [./tool.sh]}\n"+
		"  - {name: asks, exec: [./tool.sh], approval: required}\n"+
		"  - {name: own, exec: [./tool.sh], approval: required, approval_timeout: 30m}\n"), 0o644)
	r := run(t, []string{"TIMEBOX_APPROVAL_TIMEOUT=2h"}, "validate", "-f", agent, "--approval-timeout", "3h")
	if r.code != 0 {
		t.Fatalf("exit %d\n%s", r.code, r.err)
	}
	for _, re := range []string{`TOOL\s+APPROVAL\s+WAITS UP TO\s+SOURCE\s+KNOB`, `plain\s+never\s+-`,
		`asks\s+required\s+3h\s+flag\s+--approval-timeout`, `own\s+required\s+30m\s+tool\s+tools\[own\]\.approval_timeout in agent\.yaml`,
		`timeouts\.approval\s+3h\s+flag\s+--approval-timeout`} {
		if !regexpMatch(re, r.out) {
			t.Errorf("validate output lacks /%s/:\n%s", re, r.out)
		}
	}

	os.WriteFile(agent, []byte("model: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\ntools:\n"+
		"  - {name: asks, exec: [./tool.sh], approval: requird}\n"), 0o644)
	r = run(t, nil, "validate", "-f", agent)
	if want := `agent.yaml:4:47: tools[0].approval: "requird" is not an approval (did you mean required?)`; r.code != 2 || !strings.Contains(r.err, want) {
		t.Errorf("exit %d, want 2 with %s\n%s", r.code, want, r.err)
	}
}

// TestRunRefusesABusySession: a second `timebox run --session S` while a
// turn of S runs is refused (exit 1, saying so), as serve's 409 is: it ran
// on a history without the first turn and was not stored. And a --db the
// user named that is no database is refused, not a warning.
func TestRunRefusesABusySession(t *testing.T) {
	// The first turn runs 8s: long enough for a loaded machine to see it
	// running and start the second while it still runs (with 2s, a CI
	// run under load saw it end before a look found it running).
	f := agentFile(t, `{"text": "first", "first_chunk_delay": "8s"}`, `{"text": "second"}`)
	db := filepath.Join(t.TempDir(), "timebox.db")
	first := make(chan result, 1)
	go func() { first <- run(t, nil, "run", "-f", f, "--db", db, "--session", "s2", "one") }()
	wait.For(t, 10*time.Second, "the first turn is stored as running", func() bool {
		r := run(t, nil, "runs", "list", "--db", db, "--json")
		return strings.Contains(r.out, `"running"`)
	})
	r := run(t, nil, "run", "-f", f, "--db", db, "--session", "s2", "two")
	if r.code != cli.ExitFailed || !strings.Contains(r.err, "session s2 has a turn running; wait for it to end") {
		t.Errorf("a second turn on the session: exit %d\n%s%s", r.code, r.out, r.err)
	}
	if r := <-first; r.code != cli.ExitOK {
		t.Fatalf("the first turn: exit %d\n%s", r.code, r.err)
	}
	text := filepath.Join(t.TempDir(), "text.db")
	os.WriteFile(text, []byte("hello\n"), 0o644)
	if r := run(t, nil, "run", "-f", f, "--db", text, "hi"); r.code != cli.ExitFailed || !strings.Contains(r.err, "(from --db); nothing was run") {
		t.Errorf("--db naming a text file: exit %d\n%s%s", r.code, r.out, r.err)
	}
}

// TestRunsListRefusesUnknownFilters: a --status or --stop-reason no turn
// can have is refused naming the values there are, as GET /v1/turns
// refuses them; it listed "no turns match", exit 0.
func TestRunsListRefusesUnknownFilters(t *testing.T) {
	db := filepath.Join(t.TempDir(), "timebox.db")
	run(t, nil, "run", "-f", agentFile(t, `{"text": "hi"}`), "--db", db, "hi")
	for _, args := range [][]string{{"--status", "done"}, {"--stop-reason", "timeout"}} {
		r := run(t, nil, append([]string{"runs", "list", "--db", db}, args...)...)
		if r.code != cli.ExitUsage || !strings.Contains(r.err, args[0]+" must be one of ") {
			t.Errorf("%v: exit %d\n%s%s", args, r.code, r.out, r.err)
		}
	}
	if r := run(t, nil, "runs", "list", "--db", db, "--status", "completed"); r.code != cli.ExitOK {
		t.Errorf("--status completed: exit %d %s", r.code, r.err)
	}
}

// TestNoCredentialIsAConfigurationError: a chain none of whose models can
// be called (every credential variable unset) is refused before the turn
// (exit 2, naming the variables), not run into model_unavailable as an
// llm_http failure (exit 1); one callable link is enough.
func TestNoCredentialIsAConfigurationError(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "agent.yaml")
	os.WriteFile(f, []byte("model: {primary: 'openai:gpt-4o-mini', fallbacks: ['anthropic:claude-x']}\n"), 0o644)
	env := []string{"OPENAI_API_KEY=", "ANTHROPIC_API_KEY="}
	r := run(t, env, "run", "-f", f, "--no-store", "hi")
	if r.code != cli.ExitUsage || !strings.Contains(r.err, "no model of the chain can be called: OPENAI_API_KEY (for openai:gpt-4o-mini), ANTHROPIC_API_KEY (for anthropic:claude-x) are not set") {
		t.Errorf("exit %d\n%s", r.code, r.err)
	}
	if r := run(t, env, "serve", "-f", f, "--addr", "127.0.0.1:0", "--db", ""); r.code != cli.ExitUsage || !strings.Contains(r.err, "no model of the chain can be called") {
		t.Errorf("serve: exit %d\n%s", r.code, r.err)
	}
	// validate warns (exit 0: a file is often checked where its keys are
	// not), saying that run would refuse, not that failover moves on.
	if r := run(t, env, "validate", "-f", f); r.code != cli.ExitOK || !strings.Contains(r.err, "no model of the chain can be called") ||
		!strings.Contains(r.err, "timebox run and serve refuse to start") || strings.Contains(r.err, "failover will move past it") {
		t.Errorf("validate (a warning there): exit %d\n%s", r.code, r.err)
	}
}

// TestAMisspeltCommandIsNamed: a command a letter or two away from one
// gets the one meant, as a misspelt flag does.
func TestAMisspeltCommandIsNamed(t *testing.T) {
	for cmd, want := range map[string]string{"valdiate": `did you mean "validate"?`, "stat": `did you mean "stats"?`, "frob": `unknown command "frob"` + "\n"} {
		if r := run(t, nil, cmd); r.code != cli.ExitUsage || !strings.Contains(r.err, want) {
			t.Errorf("timebox %s: exit %d, %q", cmd, r.code, r.err[:min(len(r.err), 80)])
		}
	}
}

// TestAMisspeltSubcommandIsNamed: a subcommand a letter away from one of
// runs, mcp or tool gets the one meant, by the rule a misspelt command,
// flag or key gets; runs show and export without a turn say to give one.
func TestAMisspeltSubcommandIsNamed(t *testing.T) {
	db := "TIMEBOX_DB=" + filepath.Join(t.TempDir(), "timebox.db")
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"runs", "lsit"}, `timebox runs: unknown subcommand "lsit" (did you mean list?)`},
		{[]string{"runs", "exprot", "t_x"}, `timebox runs: unknown subcommand "exprot" (did you mean export?)`},
		{[]string{"mcp", "serv"}, `timebox mcp: unknown subcommand "serv" (did you mean serve?)`},
		{[]string{"tool", "cal", "x"}, `timebox tool: unknown subcommand "cal" (did you mean call?)`},
		{[]string{"runs", "show"}, `timebox runs show: give the turn's ID (timebox runs list shows them)`},
		{[]string{"runs", "export"}, `timebox runs export: give the turn's ID`},
		{[]string{"runs", "list", "completed"}, `timebox runs list: unexpected argument "completed" (filter with --status`},
		{[]string{"run", "--tol-timeout", "3s", "x"}, "Did you mean --tool-timeout?"},
	} {
		if r := run(t, []string{db}, c.args...); r.code != cli.ExitUsage || !strings.Contains(r.err, c.want) {
			t.Errorf("timebox %s: exit %d, %q", strings.Join(c.args, " "), r.code, r.err[:min(len(r.err), 120)])
		}
	}
}
