//go:build !windows

package cli_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/timebox-run/timebox/internal/proctest"
	"github.com/timebox-run/timebox/internal/syncbuf"
	"github.com/timebox-run/timebox/internal/testenv"
	"github.com/timebox-run/timebox/temporal"
)

// TestPageSaysNoWorkerTakesTheTurn: on `serve --engine temporal`, the
// only worker killed with SIGKILL while a tool runs leaves the turn's work
// to no one. The page says so — no worker takes it, on which task queue —
// instead of showing the call running on; a worker started then takes the
// turn on, and the page shows the lost call and the answer. (The page
// showed the call's clock running, "live", for as long as no worker came.)
func TestPageSaysNoWorkerTakesTheTurn(t *testing.T) {
	proctest.AfterTest(t)
	chromium(t)
	bin := timeboxBinary(t)
	addr := testenv.Temporal(t)
	dsn := testenv.Postgres(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "script.jsonl"), []byte(`{"tool_calls": [{"name": "hang"}]}
{"text": "Went on without it."}
`), 0o644)
	file := filepath.Join(dir, "agent.yaml")
	os.WriteFile(file, []byte(`model: {primary: 'script:m'}
providers: {script: {file: script.jsonl}}
timeouts: {kill_grace: 500ms}
tools:
  - {name: hang, exec: [sleep, "300"], timeout: 10m}
`), 0o644)
	// The serving gateway runs in this process: it notes the wait after 2s.
	wait := temporal.WorkerWait
	t.Cleanup(func() { temporal.WorkerWait = wait }) // after serve has stopped
	temporal.WorkerWait = 2 * time.Second
	queue := "tq-page-worker"
	common := []string{"-f", file, "--db", dsn, "--temporal-address", addr, "--task-queue", queue, "--worker-heartbeat", "1s"}
	var errA, errB syncbuf.Buffer
	w := startWorker(t, bin, common, &errA)
	p := openPage(t, serveAgentAt(t, file, dsn, "TIMEBOX_ENGINE=temporal", "TIMEBOX_TEMPORAL_ADDRESS="+addr, "TIMEBOX_TEMPORAL_TASK_QUEUE="+queue))

	p.send("hang")
	p.waitFor("the hang chip", q(`.chip[data-tool="hang"].running`))
	w.Process.Signal(syscall.SIGKILL)
	w.Wait()
	p.waitFor("the page to say no worker takes the turn", q(`.notice.waiting`))
	if got := p.text(`.notice.waiting`); !regexpMatch(`^Waiting: no timebox worker has taken this turn's work for \d+(\.\d+)?s\. Is one running on task queue "tq-page-worker"`, got) {
		p.fail("the notice reads %q", got)
	}
	startWorker(t, bin, common, &errB)
	p.waitFor("the lost call", q(`.chip[data-tool="hang"][data-outcome="interrupted"]`))
	p.waitFor("the answer", q(`.banner[data-stop-reason="answered"]`))
}
