package cli

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/user"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/internal/problem"
)

// approveFlags are the tools whose calls `timebox run --approve NAME`
// approves without asking; "all" approves every call.
type approveFlags []string

func (a *approveFlags) String() string { return strings.Join(*a, ",") }

func (a *approveFlags) Set(v string) error {
	for _, n := range strings.Split(v, ",") {
		if n = strings.TrimSpace(n); n != "" {
			*a = append(*a, n)
		}
	}
	return nil
}

// check returns an error naming the first tool of a that the agent lacks:
// a misspelt --approve would approve nothing, and its calls would be put
// to a person or denied.
func (a approveFlags) check(ag *agent.Agent) error {
	for _, n := range a {
		if n == "all" {
			continue
		}
		if err := noSuchTool(ag, n); err != nil {
			return fmt.Errorf("--approve: %w", err)
		}
	}
	return nil
}

// noSuchTool returns an error saying ag has no tool named name, with the
// tools it has, or nil when it has it.
func noSuchTool(ag *agent.Agent, name string) error {
	var names []string
	for _, t := range ag.Tools() {
		n := t.Tool.Spec().Name
		if n == name {
			return nil
		}
		names = append(names, n)
	}
	if len(names) == 0 {
		return fmt.Errorf("no tool named %q: the agent has no tools", name)
	}
	if s := problem.Suggest(name, names); s != "" {
		return fmt.Errorf("no tool named %q (did you mean %s?); the agent has: %s", name, s, strings.Join(names, ", "))
	}
	return fmt.Errorf("no tool named %q; the agent has: %s", name, strings.Join(names, ", "))
}

func (a approveFlags) approves(tool string) bool {
	return slices.Contains(a, tool) || slices.Contains(a, "all")
}

// cliApprover is `timebox run`'s agent.Approver: calls of the tools
// named by --approve are approved at once; the others are put to the
// person at the terminal, one question at a time, or — with --json or
// without a terminal — denied, saying how to approve them.
type cliApprover struct {
	auto approveFlags
	// ask is nil when nobody can be asked.
	ask *prompter
}

func (a *cliApprover) Approve(ctx context.Context, req agent.ApprovalRequest) (agent.Decision, error) {
	if a.auto.approves(req.Tool) {
		return agent.Decision{Decision: event.Approve, By: "timebox run --approve " + req.Tool}, nil
	}
	if a.ask == nil {
		return agent.Decision{Decision: event.Deny, By: "timebox run",
			Reason: fmt.Sprintf("nobody could be asked (no terminal, or --json); run again with --approve %s to approve its calls", req.Tool)}, nil
	}
	return a.ask.ask(ctx, req)
}

// prompter asks the person at the terminal, holding the live view while
// it does.
type prompter struct {
	in  io.Reader
	out io.Writer
	v   *view
	who string

	mu    sync.Mutex // one question at a time
	once  sync.Once
	lines chan string
}

func newPrompter(in io.Reader, out io.Writer, v *view) *prompter {
	who := "the terminal"
	if u, err := user.Current(); err == nil && u.Username != "" {
		who = u.Username + " at the terminal"
	}
	return &prompter{in: in, out: termSafe{out}, v: v, who: who}
}

// read starts reading the terminal's lines, once: a question that
// expires leaves the read under way for the next one.
func (p *prompter) read() {
	p.lines = make(chan string)
	go func() {
		sc := bufio.NewScanner(p.in)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
	}()
}

func (p *prompter) ask(ctx context.Context, req agent.ApprovalRequest) (agent.Decision, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.once.Do(p.read)
	if p.v != nil {
		p.v.hold(true)
		defer p.v.hold(false)
	}
	args := string(req.Arguments)
	if len(args) > 300 {
		args = args[:300] + "…"
	}
	fmt.Fprintf(p.out, "? %s %s wants to run. Approve it? [y/N, or n and a reason] (waits until %s) ",
		req.Tool, args, req.ExpiresAt.Local().Format(time.Kitchen))
	select {
	case line, ok := <-p.lines:
		if !ok {
			fmt.Fprintln(p.out)
			return agent.Decision{Decision: event.Deny, By: p.who, Reason: "the terminal closed before an answer"}, nil
		}
		answer, reason, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch strings.ToLower(answer) {
		case "y", "yes":
			return agent.Decision{Decision: event.Approve, By: p.who, Reason: strings.TrimSpace(reason)}, nil
		}
		return agent.Decision{Decision: event.Deny, By: p.who, Reason: strings.TrimSpace(reason)}, nil
	case <-ctx.Done():
		fmt.Fprintln(p.out)
		return agent.Decision{}, ctx.Err()
	}
}
