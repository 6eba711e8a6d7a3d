//go:build linux

package exectool_test

import (
	"encoding/json"
	"errors"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/config"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/doctest"
	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/tool"
	"github.com/timebox-run/timebox/tool/exectool"
)

var update = flag.Bool("update", false, "copy the files of examples/exec-tools/ into docs/exec-tools.md")

const (
	execToolsDoc = "../../docs/exec-tools.md"
	execToolsDir = "../../examples/exec-tools"
	regenerate   = "go test ./tool/exectool -run TestDocsExecTools -update"
)

// execExamples are the example tools of docs/exec-tools.md: the name of
// each one's entry in examples/exec-tools/agent.yaml, its file there, the
// language of its block on the page and the interpreter its #! line runs.
var execExamples = []struct{ name, file, lang, interpreter string }{
	{"count_lines", "count-lines.sh", "bash", "bash"},
	{"count_lines_py", "count_lines.py", "python", "python3"},
}

// TestDocsExecTools: the two tools and the agent file that
// docs/exec-tools.md shows are the files of examples/exec-tools/, byte for
// byte, and the tools are executable.
func TestDocsExecTools(t *testing.T) {
	files := []struct{ name, lang string }{{"agent.yaml", "yaml"}}
	for _, ex := range execExamples {
		files = append(files, struct{ name, lang string }{ex.file, ex.lang})
	}
	for _, f := range files {
		path := filepath.Join(execToolsDir, f.name)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		doctest.Part(t, execToolsDoc, f.name, "```"+f.lang+"\n"+string(b)+"```\n", *update, regenerate)
		if f.name == "agent.yaml" {
			continue
		}
		if st, err := os.Stat(path); err != nil || st.Mode()&0o111 == 0 {
			t.Errorf("%s is not executable (chmod +x it): %v", path, err)
		}
	}
}

// countResult is what the example tools write to stdout.
type countResult struct {
	Files     int  `json:"files"`
	Lines     int  `json:"lines"`
	Skipped   int  `json:"skipped"`
	Remaining int  `json:"remaining"`
	Complete  bool `json:"complete"`
}

func parseCount(t *testing.T, out []byte) countResult {
	t.Helper()
	var r countResult
	dec := json.NewDecoder(strings.NewReader(string(out)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("the result %q is not the documented JSON: %v", out, err)
	}
	return r
}

// lastReport keeps a call's progress reports as the runner passes them on.
type lastReport struct {
	mu   sync.Mutex
	last tool.Report
}

func (l *lastReport) hooks() tool.Hooks {
	return tool.Hooks{OnProgress: func(r tool.Report) {
		l.mu.Lock()
		defer l.mu.Unlock()
		l.last = r
	}}
}

// countDir makes a directory of files with known line counts for the
// example tools: three *.txt files, ten lines in all (one in a
// subdirectory, one whose name needs escaping in JSON), and a file the
// pattern leaves out.
func countDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, text := range map[string]string{
		"a.txt":          "one\ntwo\nthree\n",
		`b "quoted".txt`: "1\n2\n",
		"sub/c.txt":      "x\nx\nx\nx\nx\n",
		"d.log":          "not counted\n",
	} {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestExecToolExamples runs the example tools of docs/exec-tools.md, as
// examples/exec-tools/agent.yaml declares them, for real: a count with its
// progress, a call with less than a second left that answers at once with
// an incomplete count, a failure the model is told about, and a call whose
// idle budget fires while it is stuck on a file that never delivers its
// data (a FIFO nobody writes, as a file on a hung network mount), which
// must end timed_out with the partial count its SIGTERM handler wrote,
// well before the SIGKILL, and leave no process behind.
func TestExecToolExamples(t *testing.T) {
	cfg, err := config.Load(filepath.Join(execToolsDir, "agent.yaml"), config.Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Tools) != len(execExamples) {
		t.Errorf("the agent file has %d tools, want %d", len(cfg.Tools), len(execExamples))
	}
	for i, ex := range execExamples {
		t.Run(ex.name, func(t *testing.T) {
			if i >= len(cfg.Tools) || cfg.Tools[i].Name != ex.name {
				t.Fatalf("tools[%d] of the agent file is not %s", i, ex.name)
			}
			entry := cfg.Tools[i]
			want, _ := filepath.Abs(filepath.Join(execToolsDir, ex.file))
			if len(entry.Exec) != 1 || entry.Exec[0] != want {
				t.Fatalf("%s runs %v, want [%s]", ex.name, entry.Exec, want)
			}
			if _, err := exec.LookPath(ex.interpreter); err != nil {
				t.Skipf("%s is not installed, so %s is not run: %v", ex.interpreter, ex.file, err)
			}
			proctest.AfterTest(t)
			// Built as timebox.Build builds an exec entry.
			tl, err := exectool.New(exectool.Config{
				Spec: tool.Spec{Name: entry.Name, Description: entry.Description, InputSchema: entry.InputSchema},
				Argv: entry.Exec, Env: entry.Env, Withhold: cfg.Withheld(), Workdir: entry.Workdir,
			})
			if err != nil {
				t.Fatal(err)
			}
			input := func(dir string) json.RawMessage {
				b, _ := json.Marshal(map[string]string{"dir": dir, "pattern": "*.txt"})
				return b
			}
			run := func(b budget.ToolBudget, dir string, h tool.Hooks) *tool.Execution {
				return tool.Run(t.Context(), tl, &tool.Call{ID: "c1", Tool: ex.name, Input: input(dir)}, b, h)
			}

			t.Run("counts with progress", func(t *testing.T) {
				var rep lastReport
				x := run(entry.Budget, countDir(t), rep.hooks())
				if x.Outcome != event.OutcomeOK {
					t.Fatalf("outcome %s: %v (result %+v)", x.Outcome, x.Err, x.Result)
				}
				if got := parseCount(t, x.Result.Output); got != (countResult{Files: 3, Lines: 10, Complete: true}) {
					t.Errorf("result %+v, want 3 files, 10 lines, complete", got)
				}
				// A report before each of the three files and one at the end.
				if x.Progress != 4 {
					t.Errorf("%d progress reports, want 4", x.Progress)
				}
				rep.mu.Lock()
				last := rep.last
				rep.mu.Unlock()
				if last.Progress == nil || last.Total == nil || *last.Progress != 3 || *last.Total != 3 {
					t.Errorf("last report %+v, want progress 3 of 3", deref(last))
				}
			})

			t.Run("answers before its deadline", func(t *testing.T) {
				// Less than the tools' one-second margin left: they count
				// nothing and say so. The deadline is not enforced here,
				// so that a slow start cannot turn this into a timeout.
				res, err := tl.Call(t.Context(), &tool.Call{ID: "c2", Tool: ex.name, Input: input(countDir(t)),
					Deadline: time.Now().Add(900 * time.Millisecond), Timeout: 900 * time.Millisecond})
				if err != nil {
					t.Fatalf("error %v (result %+v)", err, res)
				}
				if got := parseCount(t, res.Output); got != (countResult{Remaining: 3}) {
					t.Errorf("result %+v, want nothing counted, 3 files remaining, not complete", got)
				}
				if !strings.Contains(res.StderrTail, "out of time") {
					t.Errorf("stderr tail %q does not say it ran out of time", res.StderrTail)
				}
			})

			t.Run("failure reaches the model", func(t *testing.T) {
				missing := filepath.Join(t.TempDir(), "missing")
				x := run(entry.Budget, missing, tool.Hooks{})
				var te *tool.Error
				if x.Outcome != event.OutcomeError || !errors.As(x.Err, &te) {
					t.Fatalf("outcome %s, error %T %v; want a tool error", x.Outcome, x.Err, x.Err)
				}
				if te.ExitCode == nil || *te.ExitCode != 2 || te.Message != "no such directory: "+missing+" (dir is relative to the tool's working directory)" {
					t.Errorf("exit code %v, message %q", te.ExitCode, te.Message)
				}
				var got struct{ Error tool.ErrorInfo }
				if err := json.Unmarshal([]byte(tool.ModelResult(ex.name, entry.Budget, x)), &got); err != nil {
					t.Fatal(err)
				}
				if got.Error.Type != "tool_error" || !strings.Contains(got.Error.Message, "no such directory") {
					t.Errorf("the model is told %+v", got.Error)
				}
			})

			t.Run("stopped when its budget fires", func(t *testing.T) {
				dir := countDir(t)
				if err := syscall.Mkfifo(filepath.Join(dir, "zz.txt"), 0o644); err != nil {
					t.Fatal(err)
				}
				b := entry.Budget
				b.IdleTimeout.D = 1500 * time.Millisecond
				b.KillGrace.D = 5 * time.Second
				x := run(b, dir, tool.Hooks{})
				if x.Outcome != event.OutcomeTimedOut || x.Phase != budget.PhaseToolIdle || x.Abandoned {
					t.Fatalf("outcome %s phase %s abandoned %v (err %v), want timed_out in phase tool_idle", x.Outcome, x.Phase, x.Abandoned, x.Err)
				}
				// Stopped by SIGTERM, which its handler answered, long
				// before the SIGKILL at idle timeout + kill grace (6.5s).
				if e := x.Elapsed(); e < b.IdleTimeout.D || e > b.IdleTimeout.D+4*time.Second {
					t.Errorf("elapsed %s, want %s to %s", e, b.IdleTimeout.D, b.IdleTimeout.D+4*time.Second)
				}
				if x.Progress != 4 {
					t.Errorf("%d progress reports, want one before each of the 4 files", x.Progress)
				}
				if x.Result.ExitCode == nil || *x.Result.ExitCode != 143 {
					t.Errorf("exit code %v, want 143 from its SIGTERM handler", x.Result.ExitCode)
				}
				if got := parseCount(t, x.Result.Output); got != (countResult{Files: 3, Lines: 10, Remaining: 1}) {
					t.Errorf("partial result %+v, want 3 files and 10 lines counted, 1 remaining", got)
				}
				if !strings.Contains(x.Result.StderrTail, "stopped by SIGTERM after 3 of 4 files") {
					t.Errorf("stderr tail %q", x.Result.StderrTail)
				}
				var got struct{ Error tool.ErrorInfo }
				if err := json.Unmarshal([]byte(tool.ModelResult(ex.name, b, x)), &got); err != nil {
					t.Fatal(err)
				}
				if got.Error.Type != "tool_timeout" || got.Error.Phase != "tool_idle" || !strings.Contains(got.Error.PartialOutput, `"complete": false`) {
					t.Errorf("the model is told %+v", got.Error)
				}
			})
		})
	}
}
