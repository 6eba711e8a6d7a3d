package cli_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/cli"
	"github.com/timebox-run/timebox/internal/proctest"
)

// approvalAgent writes an agent whose deploy tool needs approval and
// whose model asks for it once.
func approvalAgent(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "deploy.sh"), []byte("#!/bin/sh\ncat >/dev/null\necho deployed\n"), 0o755)
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"tool_calls": [{"name": "deploy", "arguments": {"env": "prod"}}]}`+"\n"+
		`{"text": "done"}`+"\n"), 0o644)
	agent := filepath.Join(dir, "agent.yaml")
	os.WriteFile(agent, []byte("model: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\ntools:\n"+
		"  - {name: deploy, exec: [./deploy.sh], approval: required, timeout: 5s}\n"), 0o644)
	return agent
}

func deployRecord(t *testing.T, out string) *event.ToolFinished {
	t.Helper()
	for _, e := range events(t, out) {
		if d, ok := e.Data.(*event.ToolFinished); ok && d.Tool == "deploy" {
			return d
		}
	}
	t.Fatalf("no tool_finished for deploy in:\n%s", out)
	return nil
}

// With --json nobody can be asked: the call is denied, saying how to
// approve it; --approve approves it.
func TestRunApprovalWithoutATerminal(t *testing.T) {
	proctest.AfterTest(t)
	agent := approvalAgent(t)
	r := run(t, nil, "run", "-f", agent, "--json", "--no-store", "deploy it")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.err)
	}
	if d := deployRecord(t, r.out); d.Outcome != event.OutcomeDenied || !strings.Contains(d.Result, "--approve deploy") {
		t.Errorf("without --approve: %s: %s", d.Outcome, d.Result)
	}
	r = run(t, nil, "run", "-f", agent, "--json", "--no-store", "--approve", "deploy", "deploy it")
	if d := deployRecord(t, r.out); r.code != 0 || d.Outcome != event.OutcomeOK || d.Approval == nil || d.Approval.By != "timebox run --approve deploy" {
		t.Errorf("with --approve: exit %d, %+v", r.code, d)
	}
	// A misspelt name would approve nothing: it is refused, before the
	// turn, naming it.
	r = run(t, nil, "run", "-f", agent, "--json", "--no-store", "--approve", "deplyo", "deploy it")
	if r.code != cli.ExitUsage || r.out != "" || !strings.Contains(r.err, `--approve: no tool named "deplyo" (did you mean deploy?); the agent has: deploy`) {
		t.Errorf("--approve deplyo: exit %d, %q, %q", r.code, r.err, r.out)
	}
	if r = run(t, nil, "run", "-f", agent, "--json", "--no-store", "--approve", "all", "deploy it"); r.code != 0 {
		t.Errorf("--approve all: exit %d, %q", r.code, r.err)
	}
}

// On a terminal the person is asked; "n" and a reason deny the call, and
// the model is told the reason.
func TestRunAsksOnTheTerminal(t *testing.T) {
	proctest.AfterTest(t)
	agent := approvalAgent(t)
	for _, tc := range []struct {
		answer, want, line string
	}{
		{"y\n", "ok", "deploy approved by"},
		{"n not during the freeze\n", "denied", "deploy denied by"},
	} {
		var out, errb bytes.Buffer
		code := cli.Run(t.Context(), []string{"run", "-f", agent, "--no-store", "deploy it"},
			cli.IO{In: strings.NewReader(tc.answer), Out: &out, Err: &errb, Terminal: true, InTerminal: true, Env: []string{"NO_COLOR=1"}})
		if code != 0 {
			t.Fatalf("exit %d: %s", code, errb.String())
		}
		for _, want := range []string{"? deploy {\"env\": \"prod\"} wants to run. Approve it?", tc.line} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("answer %q: the terminal lacks %q:\n%s", tc.answer, want, out.String())
			}
		}
		if tc.want == "denied" && !strings.Contains(out.String(), "not during the freeze") {
			t.Errorf("the reason is not shown:\n%s", out.String())
		}
	}
}
