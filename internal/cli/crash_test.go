//go:build !windows

package cli_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctree"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/internal/wait"
	"github.com/timebox-run/timebox/store"
	"github.com/timebox-run/timebox/store/sqlite"
)

// crashTool is a tool whose root starts a child in its process group, which
// starts a setsid grandchild; it writes their pids to the file named by
// PIDFILE and hangs.
const crashTool = `#!/usr/bin/env bash
cat >/dev/null
( setsid sleep 300 & echo "grandchild $!" >> "$PIDFILE"; exec sleep 300 ) &
echo "child $!" >> "$PIDFILE"
echo "root $$" >> "$PIDFILE"
echo '::progress:: started' >&2
exec sleep 300
`

// TestKill9ServeMidToolThenRestart kills `timebox serve` with SIGKILL while
// a tool with a child and a setsid grandchild runs: the tool's root dies
// with it (PR_SET_PDEATHSIG), the next start kills the rest within 5s and
// says so, and the stored turn is interrupted with the call recorded as
// interrupted.
func TestKill9ServeMidToolThenRestart(t *testing.T) {
	bin := timeboxBinary(t)
	for _, s := range []proctree.Strategy{proctree.Cgroup, proctree.Track} {
		t.Run(string(s), func(t *testing.T) {
			if _, err := proctree.Resolve(s); err != nil {
				t.Skip(err)
			}
			dir := t.TempDir()
			pidfile := filepath.Join(dir, "pids")
			db := filepath.Join(dir, "timebox.db")
			os.WriteFile(filepath.Join(dir, "crash.sh"), []byte(crashTool), 0o755)
			os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"tool_calls": [{"name": "crash"}]}`+"\n"+`{"text": "never"}`+"\n"), 0o644)
			file := filepath.Join(dir, "agent.yaml")
			os.WriteFile(file, []byte("model: {primary: script:m}\nproviders: {script: {file: script.jsonl}}\ntools:\n  - name: crash\n    exec: [./crash.sh]\n    timeout: 10m\n"), 0o644)
			env := append(os.Environ(), "PIDFILE="+pidfile, proctree.EnvStrategy+"="+string(s))

			var errb1 syncbuf.Buffer
			serve, url := startServe(t, bin, file, db, env, &errb1)
			resp, err := http.Post(url+"/v1/turns", "application/json", strings.NewReader(`{"input": "go", "detach": true}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			pids := map[string]string{}
			deadline := time.Now().Add(20 * time.Second)
			for len(pids) < 3 {
				if time.Now().After(deadline) {
					t.Fatalf("the tool never started: pids %v\n%s", pids, errb1.String())
				}
				time.Sleep(20 * time.Millisecond)
				for line := range strings.Lines(readFile(pidfile)) {
					if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
						pids[k] = v
					}
				}
			}
			t.Cleanup(func() {
				for _, p := range pids {
					var pid int
					fmt.Sscan(p, &pid)
					syscall.Kill(pid, syscall.SIGKILL)
				}
			})

			serve.Process.Kill() // SIGKILL: nothing can be cleaned up
			serve.Wait()
			if !waitDead(pids["root"], 5*time.Second) {
				t.Fatalf("the tool's root %s outlived timebox: no parent-death signal", pids["root"])
			}
			// Other test processes on this machine may reap them first;
			// then this run cannot show that the restart does.
			orphansLeft := alive(pids["child"]) && alive(pids["grandchild"])
			if !orphansLeft {
				t.Logf("the child or grandchild was gone before the restart (another timebox process reaped it)")
			}

			var errb2 syncbuf.Buffer
			restarted := time.Now()
			serve2, _ := startServe(t, bin, file, db, env, &errb2)
			for _, who := range []string{"child", "grandchild"} {
				if !waitDead(pids[who], 5*time.Second-time.Since(restarted)) {
					t.Errorf("the tool's %s %s is alive 5s after the restart", who, pids[who])
				}
			}
			if orphansLeft && !strings.Contains(errb2.String(), "stopped 2 tool processes left running by timebox (pid ") {
				t.Errorf("the restart did not say what it reaped: %q", errb2.String())
			}
			serve2.Process.Signal(syscall.SIGTERM)
			if err := serve2.Wait(); err != nil {
				t.Errorf("the restarted server exited with %v: %s", err, errb2.String())
			}

			st, err := sqlite.Open(db, sqlite.Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			ctx := context.Background()
			list, err := st.Turns(ctx, store.Filter{})
			if err != nil || len(list) != 1 {
				t.Fatalf("turns %+v, %v", list, err)
			}
			rec, err := st.Turn(ctx, list[0].TurnID)
			if err != nil {
				t.Fatal(err)
			}
			if rec.Status != budget.StatusInterrupted || !strings.Contains(rec.Message, "at least ") ||
				!strings.Contains(rec.Message, "Tool crash was running") {
				t.Errorf("turn %s: %s", rec.Status, rec.Message)
			}
			if len(rec.ToolCalls) != 1 || rec.ToolCalls[0].Outcome != event.OutcomeInterrupted || rec.ToolCalls[0].Tool != "crash" {
				t.Errorf("tool calls %+v", rec.ToolCalls)
			}
		})
	}
}

// waitDead polls until pid is not alive, for at most d.
func waitDead(pid string, d time.Duration) bool {
	return wait.Until(d, func() bool { return !alive(pid) })
}
