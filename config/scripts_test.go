//go:build !windows

package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExecProgramsThatCannotRun: an exec tool's program that is an
// executable file but could never run — empty, neither a binary nor a #!
// script, a #! line ending in a carriage return (Windows line endings), an
// interpreter that is not there — is refused by validate, at the tool's
// exec, instead of every call failing with "no such file".
func TestExecProgramsThatCannotRun(t *testing.T) {
	path := writeAgent(t, "")
	dir := filepath.Dir(path)
	for name, body := range map[string]string{
		"crlf.sh":      "#!/bin/sh\r\necho hi\r\n",
		"plain.sh":     "echo hi\n",
		"python9.sh":   "#!/usr/bin/python9\nprint(1)\n",
		"envmiss.sh":   "#!/usr/bin/env nosuchinterp\n",
		"empty.sh":     "",
		"good.sh":      "#!/bin/sh\necho hi\n",
		"goodenv.sh":   "#!/usr/bin/env sh\necho hi\n",
		"binary":       "\x7fELF\x02\x01\x01",
		"blankbang.sh": "#!\n",
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var tools strings.Builder
	for _, name := range []string{"crlf.sh", "plain.sh", "python9.sh", "envmiss.sh", "empty.sh", "good.sh", "goodenv.sh", "binary", "blankbang.sh"} {
		tools.WriteString("  - {name: " + strings.TrimSuffix(name, ".sh") + ", exec: [./" + name + "]}\n")
	}
	body := "model: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\ntools:\n" + tools.String()
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path, Overrides{Env: []string{"PATH=/usr/bin:/bin"}})
	if err == nil {
		t.Fatal("loaded")
	}
	got := err.Error()
	for _, want := range []string{
		`tools[0].exec[0]: "./crlf.sh" has Windows line endings: its #! line ends in a carriage return`,
		`tools[1].exec[0]: "./plain.sh" has no #! line, so it cannot be run as a program (make its first line #!/bin/sh`,
		`tools[2].exec[0]: "./python9.sh" asks for the interpreter /usr/bin/python9, which is not there`,
		`tools[3].exec[0]: "./envmiss.sh" asks for the interpreter nosuchinterp (#!/usr/bin/env nosuchinterp), which is not found in PATH`,
		`tools[4].exec[0]: "./empty.sh" is empty`,
		`tools[8].exec[0]: "./blankbang.sh" has an empty #! line`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("lacks %q", want)
		}
	}
	for _, ok := range []string{"tools[5]", "tools[6]", "tools[7]"} {
		if strings.Contains(got, ok) {
			t.Errorf("refused %s, which runs", ok)
		}
	}
	if t.Failed() {
		t.Log(got)
	}
}

// TestExecArgumentsHoldNoNUL: a NUL in an exec program or argument (which
// the system would cut the string at) is refused, and the message shows
// it escaped, not as a raw byte.
func TestExecArgumentsHoldNoNUL(t *testing.T) {
	path := writeAgent(t, "model: {primary: 'script:m'}\nproviders: {script: {file: script.jsonl}}\n"+
		"tools: [{name: a, exec: [\"ls\\0x\"]}, {name: b, exec: [/bin/echo, \"a\\0b\"]}]\n")
	_, err := Load(path, Overrides{})
	if err == nil {
		t.Fatal("loaded")
	}
	for _, want := range []string{`tools[0].exec[0]: "ls\x00x" holds a NUL character`, `tools[1].exec[1]: "a\x00b" holds a NUL character`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("lacks %q: %v", want, err)
		}
	}
	if strings.ContainsRune(err.Error(), 0) {
		t.Errorf("the message holds a raw NUL: %q", err)
	}
}
