package cli_test

import (
	"encoding/json"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctest"
)

// TestToolsCannotReadTimeboxsEnvironment: a tool running as timebox's
// user cannot read timebox's secrets from /proc/$PPID/environ, though
// the same user owns both (HideProcess). The binary runs as nobody, so
// that neither it nor its tool is root, which reads any process.
func TestToolsCannotReadTimeboxsEnvironment(t *testing.T) {
	proctest.AfterTest(t)
	if os.Geteuid() != 0 {
		t.Skip("runs timebox as nobody, which needs root")
	}
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip(err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	dir, err := os.MkdirTemp("", "tbhide")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	bin, err := os.ReadFile(timeboxBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "timebox"), bin, 0o755); err != nil {
		t.Fatal(err)
	}
	agent := `model: {primary: script:m}
providers: {script: {file: script.jsonl}}
tools:
  - name: probe
    description: Reads its parent's environment.
    exec: [sh, -c, 'if grep -qa probe-s3cret /proc/$PPID/environ 2>/dev/null; then echo read; else echo hidden; fi']
`
	for name, text := range map[string]string{"agent.yaml": agent, "script.jsonl": `{"text": "x"}` + "\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(filepath.Join(dir, "timebox"), "tool", "call", "probe", "-f", "agent.yaml")
	cmd.Dir = dir
	cmd.Env = proctest.Env([]string{"PATH=/usr/bin:/bin", "HOME=" + dir, "TIMEBOX_DB=", "TIMEBOX_TOKEN=probe-s3cret"})
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	out, err := cmd.Output()
	var rec event.ToolCall
	if jerr := json.Unmarshal(out, &rec); jerr != nil {
		t.Fatalf("%v (%v)\n%s", jerr, err, out)
	}
	if !strings.HasPrefix(rec.Result, "hidden\n") {
		t.Fatalf("the tool's result is %q: it read timebox's environment", rec.Result)
	}
}
