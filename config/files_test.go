package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/testenv"
)

// TestFilesAreCheckedAsTheyWillBeUsed: Load parses the script the way the
// script model will play it, and finds each program the way exec will, so
// that what run would refuse is refused by validate too.
func TestFilesAreCheckedAsTheyWillBeUsed(t *testing.T) {
	bin := t.TempDir()
	for name, mode := range map[string]os.FileMode{"tool-ok": 0o755, "tool-noexec": 0o644} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"), mode); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{"PATH=relative/dir:" + bin}
	for _, c := range []struct {
		name, script, tools string
		env                 []string
		want                []string
	}{
		{name: "a good script and programs in PATH", script: `{"text": "hi"}`,
			tools: "tools: [{name: a, exec: [tool-ok]}, {name: b, mcp: {command: [tool-ok, --stdio]}}]\n", env: env},
		{name: "a bad script line, reported in the script, after the agent file's problems",
			script: `{"text": "hi"}` + "\n" + `{"text": "a", "tool_calls": [{"nmae": "x"}]}`, tools: "limits: {max_steps: 0}\n",
			want: []string{
				`agent.yaml:3:21: limits.max_steps: 0 is below the minimum`,
				`script.jsonl:2:31: tool_calls[0].nmae: unknown field (did you mean name?)`,
			}},
		{name: "every bad script line, after the agent file's problems, even those read later",
			script: `{"txt": 1}` + "\n" + `{"text": 5, "chunk_delay": 50}`, tools: "tools: [{name: a, exec: [tool-missing]}]\n", env: env,
			want: []string{
				`agent.yaml:3:26: tools[0].exec[0]: "tool-missing" is not found in PATH`,
				`script.jsonl:1:2: txt: unknown field (did you mean text?)`,
				`script.jsonl:2:10: text: 5 is not a string (put it in quotes: "5")`,
				`script.jsonl:2:28: chunk_delay: 50 is not a duration (a duration is a string like "50ms")`,
			}},
		{name: "only compaction lines", script: `{"compaction": true, "text": "a summary"}`,
			want: []string{`agent.yaml:2:28: providers.script.file: "script.jsonl": every line is a compaction line; add a reply for the turn`}},
		{name: "not in PATH", script: `{"text": "hi"}`, tools: "tools: [{name: a, exec: [tool-missing]}]\n", env: env,
			want: []string{`agent.yaml:3:26: tools[0].exec[0]: "tool-missing" is not found in PATH (install it, or give its path from the agent file's directory, such as ./tool-missing)`}},
		{name: "in PATH but not executable", script: `{"text": "hi"}`, tools: "tools: [{name: a, mcp: {command: [tool-noexec]}}]\n", env: env,
			want: []string{`tools[0].mcp.command[0]: "tool-noexec" is found in PATH as ` + bin + `/tool-noexec, which is not executable`}},
		{name: "PATH not given: not looked up", script: `{"text": "hi"}`, tools: "tools: [{name: a, exec: [tool-missing]}]\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Chdir(dir)
			os.WriteFile("script.jsonl", []byte(c.script+"\n"), 0o644)
			os.WriteFile("agent.yaml", []byte("model: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\n"+c.tools), 0o644)
			a, err := Load("agent.yaml", Overrides{Env: c.env})
			if len(c.want) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				if len(a.Providers["script"].Script) != 1 {
					t.Fatalf("script lines %+v", a.Providers["script"].Script)
				}
				return
			}
			es, _ := err.(Errors)
			if len(es) != len(c.want) {
				t.Fatalf("got %v\nwant %q", err, c.want)
			}
			for i, w := range c.want {
				if !strings.Contains(es[i].Error(), w) {
					t.Errorf("problem %d: %s\nwant %s", i, es[i].Error(), w)
				}
			}
		})
	}
}

// TestScriptNotARegularFile: a FIFO (with no writer) or a device as the
// script is a problem at its key, at once.
func TestScriptNotARegularFile(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo.jsonl")
	testenv.Mkfifo(t, fifo)
	for file, want := range map[string]string{
		"fifo.jsonl": `agent.yaml:2:28: providers.script.file: "fifo.jsonl" is a named pipe (FIFO), not a regular file`,
		"/dev/zero":  `agent.yaml:2:28: providers.script.file: "/dev/zero" is a character device, not a regular file`,
	} {
		os.WriteFile(filepath.Join(dir, "agent.yaml"), []byte("model: {primary: 'script:m'}\nproviders: {script: {file: "+file+"}}\n"), 0o644)
		done := make(chan error, 1)
		go func() {
			_, err := Load(filepath.Join(dir, "agent.yaml"), Overrides{})
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil || !strings.HasSuffix(err.Error(), strings.TrimPrefix(want, "agent.yaml")) {
				t.Errorf("%s: got %v\nwant %s", file, err, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Load blocked", file)
		}
	}
}

// TestTurnMayLastAWeek: timeouts.turn goes up to 7 days (long agentic
// tasks); every other duration stays within 24h.
func TestTurnMayLastAWeek(t *testing.T) {
	head := "model: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\n"
	a, err := Load(writeAgent(t, head+"timeouts: {turn: 168h}\n"), Overrides{})
	if err != nil || a.Budgets.Turn.D != 7*24*time.Hour {
		t.Fatalf("168h: %v", err)
	}
	for body, want := range map[string]string{
		"timeouts: {turn: 169h}\n":  `timeouts.turn: "169h" is above 168h, the largest allowed (lower it)`,
		"timeouts: {turn: 8d}\n":    `timeouts.turn: "8d" is not a duration (use 192h)`,
		"timeouts: {step: 25h}\n":   `timeouts.step: "25h" is above 24h, the largest allowed (lower it)`,
		"timeouts: {llm_idle: 48h}": `timeouts.llm_idle: "48h" is above 24h`,
		// Past what a duration, a count or a size holds: the limit, not
		// "not a duration" or a bare "too large".
		"timeouts: {tool: 2562048h}\n":                    `timeouts.tool: "2562048h" is above 24h, the largest allowed (lower it)`,
		"timeouts: {turn: 9999999999999h}\n":              `timeouts.turn: "9999999999999h" is above 168h, the largest allowed (lower it)`,
		"limits: {max_steps: 99999999999999999999}\n":     `limits.max_steps: "99999999999999999999" is above the maximum (use at most 100000)`,
		"limits: {max_steps: -99999999999999999999}\n":    `limits.max_steps: "-99999999999999999999" is negative`,
		"limits: {max_reply: 9999999999999999999GiB}\n":   `limits.max_reply: "9999999999999999999GiB" is above the maximum (use at most 16MiB)`,
		"timeouts: {kill_grace: 99999999999999999999s}\n": `timeouts.kill_grace: "99999999999999999999s" is above 24h`,
	} {
		_, err := Load(writeAgent(t, head+body), Overrides{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v\nwant %s", body, err, want)
		}
	}
	if _, err := Load(writeAgent(t, head), Overrides{Flags: map[string]string{"timeouts.turn": "100h"}}); err != nil {
		t.Errorf("--turn-timeout 100h: %v", err)
	}
}

// TestAMisspeltFileGetsTheOneMeant: an agent file, a script or a program
// that does not exist, a letter away from one that does, is met with the
// one meant, as a misspelt key is.
func TestAMisspeltFileGetsTheOneMeant(t *testing.T) {
	path := writeAgent(t, "model: {primary: script:m}\nproviders: {script: {file: scirpt.jsonl}}\ntools:\n  - {name: a, exec: [./agent.yml]}\n")
	_, err := Load(filepath.Join(filepath.Dir(path), "agnet.yaml"), Overrides{})
	if err == nil || !strings.HasSuffix(err.Error(), "agnet.yaml: the agent file does not exist (did you mean "+filepath.Join(filepath.Dir(path), "agent.yaml")+"?)") {
		t.Errorf("agnet.yaml: %v", err)
	}
	_, err = Load(path, Overrides{})
	for _, want := range []string{
		`providers.script.file: "scirpt.jsonl" does not exist (did you mean script.jsonl? relative paths are relative to the agent file's directory)`,
		`tools[0].exec[0]: "./agent.yml" does not exist (did you mean ./agent.yaml? relative paths`,
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in\n%v", want, err)
		}
	}
}
