//go:build faults && linux

package faults

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/proctree"
)

// Tool programs whose process trees try to outlive their call. Each reads
// its request, writes "role pid" lines to $PIDFILE as it sets up, "ready"
// last, and hangs. They run under timebox's own bash, so that the trees
// are what a user's script makes.
const (
	// The classic daemon: a middle process starts the daemon in a new
	// session and exits at once, so the daemon's parent is gone.
	doubleFork = `#!/usr/bin/env bash
cat >/dev/null
( setsid bash -c 'echo "daemon $$" >> "$PIDFILE"; exec sleep 300' & )
echo "root $$" >> "$PIDFILE"
sleep 0.2 # the daemon has written its pid
echo "ready $$" >> "$PIDFILE"
exec sleep 300
`
	// A child that starts its own session, leaving the process group.
	setsidEscapee = `#!/usr/bin/env bash
cat >/dev/null
setsid sleep 300 &
echo "escapee $!" >> "$PIDFILE"
echo "ready $$" >> "$PIDFILE"
exec sleep 300
`
	// A child in a session of its own that writes itself into the cgroup
	// hierarchy's root (as root can; $CGROUP_ROOT_PROCS) and ignores
	// SIGTERM: out of its call's cgroup, its process group and its
	// session.
	cgroupEscapee = `#!/usr/bin/env bash
cat >/dev/null
setsid bash -c 'if echo $$ > "$CGROUP_ROOT_PROCS"; then echo "moved $$" >> "$PIDFILE"; fi; echo "escapee $$" >> "$PIDFILE"; trap "" TERM; exec sleep 600' &
sleep 0.2 # the escapee has moved
echo "ready $$" >> "$PIDFILE"
exec sleep 300
`
	// A tree that ignores SIGTERM from top to bottom: five children, each
	// with a sleep of its own; only SIGKILL after kill_grace stops it.
	termIgnoringTree = `#!/usr/bin/env bash
cat >/dev/null
trap '' TERM
for i in 1 2 3 4 5; do
  bash -c 'echo "child $$" >> "$PIDFILE"; while :; do sleep 1; done' &
done
echo "ready $$" >> "$PIDFILE"
while :; do sleep 1; done
`
	// 200 children that ignore SIGTERM, then a root that goes on forking
	// one more every 50ms while it is being stopped.
	forkBomb = `#!/usr/bin/env bash
cat >/dev/null
trap '' TERM
for i in $(seq 200); do
  sleep 300 &
  echo "child $!" >> "$PIDFILE"
done
echo "ready $$" >> "$PIDFILE"
while :; do sleep 300 & sleep 0.05; done
`
)

// processTrees: a hard call whose tree escapes every way a script can
// is stopped at its deadline (SIGTERM, then SIGKILL after kill_grace) and
// nothing of the tree is left, under both process-tree strategies, through
// `timebox run`. The call's record and the stored turn keep its end.
func processTrees(t *testing.T) {
	cases := []struct {
		name, program string
		// roles the program must have written: proof that the tree it
		// means to leave was there.
		roles []string
		// ignoresTerm: the tree is stopped only by SIGKILL, kill_grace
		// (500ms) after the deadline.
		ignoresTerm bool
		children    int // the "child" lines it writes, at least
		// timeout is the tool's, 2s unless set: long enough for the tree
		// to be set up on a loaded machine before its deadline.
		timeout time.Duration
		root    bool // needs root (to move a process between cgroups)
		// enforcement is the tool's, hard unless set: an exec tool is
		// stopped whole, and waited for, whatever it says.
		enforcement string
	}{
		{name: "double fork", program: doubleFork, roles: []string{"daemon", "root", "ready"}},
		{name: "setsid escapee", program: setsidEscapee, roles: []string{"escapee", "ready"}},
		{name: "root cgroup escapee", program: cgroupEscapee, roles: []string{"escapee", "ready"}, ignoresTerm: true, root: true},
		{name: "TERM-ignoring tree", program: termIgnoringTree, roles: []string{"child", "ready"}, ignoresTerm: true, children: 5},
		{name: "cooperative TERM-ignoring tree", program: termIgnoringTree, roles: []string{"child", "ready"}, ignoresTerm: true, children: 5, enforcement: "cooperative"},
		{name: "200-child fork bomb", program: forkBomb, roles: []string{"child", "ready"}, ignoresTerm: true, children: 200, timeout: 10 * time.Second},
	}
	const grace = 500 * time.Millisecond
	for _, tc := range cases {
		timeout := cmp.Or(tc.timeout, 2*time.Second)
		for _, s := range []proctree.Strategy{proctree.Cgroup, proctree.Track} {
			t.Run(tc.name+"/"+string(s), func(t *testing.T) {
				if _, err := proctree.Resolve(s); err != nil {
					t.Skip(err)
				}
				env := []string{"", proctree.EnvStrategy + "=" + string(s)} // PIDFILE first, once the agent is made
				if tc.root {
					procs := rootCgroupProcs()
					if os.Geteuid() != 0 || procs == "" {
						t.Skip("moving a process to the cgroup hierarchy's root needs root and a cgroup2 mount of it")
					}
					env = append(env, "CGROUP_ROOT_PROCS="+procs)
				}
				sc := begin(t, tc.name+" ("+string(s)+")", "timebox run --json")
				a := newAgent(t, scriptAgent(fmt.Sprintf("kill_grace: %s", grace), "",
					fmt.Sprintf("{name: tree, description: Hangs., exec: [./tree.sh], timeout: %s, enforcement: %s}", timeout, cmp.Or(tc.enforcement, "hard"))),
					[]string{callTools("tree"), `{"text": "done"}`}, map[string]string{"tree.sh": tc.program})
				env[0] = "PIDFILE=" + a.pidfile
				p := startTimebox(t, a.dir, env, nil, "run", "-f", a.file, "--db", a.db, "--json", "go")
				if code := p.wait(60 * time.Second); code != 0 {
					t.Fatalf("exit %d\n%s", code, p.stderr.String())
				}
				pids := a.pids()
				for _, role := range tc.roles {
					if len(pids[role]) == 0 {
						t.Fatalf("the program had not written its %s when it was stopped at its %s deadline (the machine too busy?); pids %v: the scenario proves nothing", role, timeout, pids)
					}
				}
				if len(pids["child"]) < tc.children {
					t.Fatalf("%d children of %d", len(pids["child"]), tc.children)
				}
				seen := p.log.snapshot()
				rec := toolRecords(seen)["call_1"]
				if rec == nil {
					for _, r := range toolRecords(seen) {
						rec = r
					}
				}
				if rec == nil {
					t.Fatalf("no tool_finished\n%s", p.stderr.String())
				}
				sc.is("outcome", string(rec.Outcome), string(event.OutcomeTimedOut))
				sc.is("recorded abandoned", fmt.Sprint(rec.Abandoned), "false")
				past := time.Duration(rec.DurationMS-rec.TimeoutMS) * time.Millisecond
				bound := 1500 * time.Millisecond
				if tc.ignoresTerm {
					bound += grace
				}
				sc.within("past the deadline (kill_grace "+grace.String()+")", past, bound)
				if tc.root {
					moved := len(pids["moved"]) > 0
					sc.add("the escapee left the call's cgroup", "either (refused under a cgroup namespace with nsdelegate)", fmt.Sprint(moved), true)
					if moved && s == proctree.Cgroup {
						said := strings.Contains(rec.StderrTail, "had left the call's cgroup")
						sc.truth("the call's stderr_tail says a process left its cgroup", "yes", fmt.Sprint(said), said)
					}
				}
				sc.allDead(pids)
				sc.nothingLeft(p.pid())
				st, evs := stored(t, a.db, "")
				sc.records(seen, st, evs)
				sc.memory("peak memory of timebox", p.peak(), 200)
			})
		}
	}
}

// rootCgroupProcs returns the cgroup.procs of the cgroup2 hierarchy's root
// as this process sees it mounted, or "" when no mount shows the root.
func rootCgroupProcs() string {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	for line := range strings.Lines(string(b)) {
		pre, post, ok := strings.Cut(line, " - ")
		pf, qf := strings.Fields(pre), strings.Fields(post)
		if ok && len(pf) >= 5 && len(qf) >= 1 && qf[0] == "cgroup2" && pf[3] == "/" {
			return filepath.Join(pf[4], "cgroup.procs")
		}
	}
	return ""
}
