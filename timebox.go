// Package timebox builds a runnable agent from an agent file: its model
// chain with every credential, its exec and MCP tools, and its resolved
// budgets. It is the library's front door; the turn loop itself is package
// agent, which programs may also use directly to build an agent from code.
//
//	a, err := timebox.Open(ctx, "agent.yaml", timebox.Options{})
//	if err != nil { ... }
//	defer a.Close()
//	res := a.Run(ctx, agent.Input{Text: "hello"}, sink)
//	fmt.Println(res.Record.Message)
package timebox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/trace"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/config"
	"github.com/timebox-run/timebox/internal/proctree"
	"github.com/timebox-run/timebox/model"
	"github.com/timebox-run/timebox/model/anthropic"
	"github.com/timebox-run/timebox/model/openai"
	"github.com/timebox-run/timebox/model/script"
	"github.com/timebox-run/timebox/tool"
	"github.com/timebox-run/timebox/tool/exectool"
	"github.com/timebox-run/timebox/tool/runas"
)

// Version is the timebox release.
const Version = "0.1.0"

// Options are the choices a program makes when it opens an agent file.
type Options struct {
	// Overrides are flag values and the environment, resolved over the
	// file (flag > env > file > default).
	Overrides config.Overrides
	// Tools are Go-function tools the program registers, next to the
	// file's tools. A zero Budget takes the file's defaults; a timeout
	// over the file's timeouts.tool_max is an error, as in the file.
	Tools []agent.Tool
	// Getenv reads credentials; nil is os.Getenv.
	Getenv func(string) string
	// Record, if set, receives every model reply with its timings as
	// script lines (model/script), for replaying an incident offline.
	Record *script.Recording
	// TracerProvider, if set, traces every turn (docs/observability.md);
	// telemetry.FromEnv makes one from the OTEL_* variables.
	TracerProvider trace.TracerProvider
}

// Agent is an agent built from a file. Close it when done: it owns the
// processes of its MCP servers.
type Agent struct {
	*agent.Agent
	// Config is the loaded, resolved agent file.
	Config *config.Agent

	closeMu sync.Mutex
	closers []func() error
}

// Close stops everything the agent owns. It is idempotent, and safe to
// call from several goroutines: the first call stops it, the others wait
// for that and return nil.
func (a *Agent) Close() error {
	a.closeMu.Lock()
	defer a.closeMu.Unlock()
	var errs []error
	for i := len(a.closers) - 1; i >= 0; i-- {
		errs = append(errs, a.closers[i]())
	}
	a.closers = nil
	return errors.Join(errs...)
}

// Open loads the agent file at path and builds the agent. A configuration
// problem is a config.Errors listing every problem with its position.
func Open(ctx context.Context, path string, o Options) (*Agent, error) {
	cfg, err := config.Load(path, o.Overrides)
	if err != nil {
		return nil, err
	}
	return Build(ctx, cfg, o)
}

// Build builds the agent described by a loaded configuration.
func Build(ctx context.Context, cfg *config.Agent, o Options) (*Agent, error) {
	getenv := o.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	// The process-tree strategy is read from this process's environment
	// when a tool runs; one this platform lacks would fail every call of
	// every exec tool while the turn went on. timebox's commands check it
	// at start too.
	if err := proctree.Check(os.Getenv(proctree.EnvStrategy)); err != nil {
		return nil, err
	}
	a := &Agent{Config: cfg}
	models, err := Endpoints(cfg, getenv)
	if err != nil {
		return nil, err
	}
	if o.Record != nil {
		for i := range models {
			models[i].Provider = o.Record.Wrap(models[i].Provider)
		}
	}
	tools, err := buildTools(ctx, cfg, a)
	if err != nil {
		a.Close()
		return nil, err
	}
	// A Go tool named as a tool of the file is told apart from two tools
	// of the file that clash (agent.New's "two tools are named"): the
	// program's tool is the one to rename.
	fromFile := map[string]bool{}
	for _, t := range tools {
		fromFile[t.Tool.Spec().Name] = true
	}
	for i, t := range o.Tools {
		if t.Tool != nil && fromFile[t.Tool.Spec().Name] {
			a.Close()
			return nil, fmt.Errorf("Options.Tools[%d]: %q is the name of a tool of %s; give the Go tool another name (the model calls tools by name)", i, t.Tool.Spec().Name, cfg.Path)
		}
	}
	// A Go tool's unset budget fields are filled by agent.New, from the
	// same resolved budgets.
	tools = append(tools, o.Tools...)
	ag, err := agent.New(agent.Config{
		Name: cfg.Name, Instructions: cfg.Instructions, Models: models, Tools: tools,
		Budgets: cfg.Budgets, Limits: cfg.Limits, CompactAt: cfg.Context.CompactAt,
		CompactAtSource: cfg.Context.Source, CompactAtKnob: cfg.Context.Knob, RequestMax: cfg.Server.RequestMax,
		TimeNotes: cfg.Context.TimeNotes, Origin: cfg.Path, TracerProvider: o.TracerProvider,
	})
	if err != nil {
		a.Close()
		return nil, err
	}
	a.Agent = ag
	return a, nil
}

// Endpoints builds the failover chain: each model of the chain in order,
// with each of its provider's credentials in order. A credential whose
// variable is unset becomes an endpoint that fails at once with a clear
// reason, so failover moves past it and the turn's message names it.
func Endpoints(cfg *config.Agent, getenv func(string) string) ([]model.Endpoint, error) {
	var out []model.Endpoint
	scripts := map[string]*script.Provider{}
	for _, ref := range cfg.Model.All() {
		p := cfg.Providers[ref.Provider]
		switch ref.Provider {
		case "script":
			sp := scripts[p.File]
			if sp == nil {
				// config.Load parsed the file; a configuration built in
				// code may name only the file.
				var err error
				if len(p.Script) > 0 {
					sp, err = script.New(p.Script)
				} else {
					sp, err = script.Load(p.File)
				}
				if err != nil {
					return nil, fmt.Errorf("providers.script.file: %w", err)
				}
				scripts[p.File] = sp
			}
			out = append(out, model.Endpoint{Provider: sp, ProviderName: "script", Model: ref.Model})
		case "openai", "anthropic":
			for _, c := range p.Credentials {
				key := getenv(c.APIKeyEnv)
				ep := model.Endpoint{ProviderName: ref.Provider, Model: ref.Model, Profile: c.APIKeyEnv}
				switch {
				case key == "":
					ep.Provider = unsetCredential{provider: ref.Provider, env: c.APIKeyEnv}
				case ref.Provider == "openai":
					ep.Provider = openai.New(openai.Options{BaseURL: p.BaseURL, APIKey: key, MaxTokens: cfg.Model.MaxTokens})
				default:
					ep.Provider = anthropic.New(anthropic.Options{BaseURL: p.BaseURL, APIKey: key, MaxTokens: cfg.Model.MaxTokens})
				}
				out = append(out, ep)
			}
		default:
			return nil, fmt.Errorf("model %s: unknown provider %q", ref, ref.Provider)
		}
	}
	return out, nil
}

// NoCredential returns an error, saying which variables to set, when no
// link of the model chain can be called: every one is of a provider whose
// credential variables are all unset. A turn would fail at once, every
// attempt "not set in the environment"; commands that run turns refuse to
// start instead, as for any error of configuration. A chain with one link
// that can be called is not refused: failover moves past the others.
func NoCredential(cfg *config.Agent, getenv func(string) string) error {
	if getenv == nil {
		getenv = os.Getenv
	}
	var unset []string
	for _, ref := range cfg.Model.All() {
		p := cfg.Providers[ref.Provider]
		if ref.Provider != "openai" && ref.Provider != "anthropic" {
			return nil // script: nothing to set
		}
		for _, c := range p.Credentials {
			if getenv(c.APIKeyEnv) != "" {
				return nil
			}
			unset = append(unset, c.APIKeyEnv+" (for "+ref.String()+")")
		}
	}
	if len(unset) == 0 {
		return nil
	}
	return fmt.Errorf("no model of the chain can be called: %s %s not set in the environment; set one (export NAME=…), or use the script model to try timebox without a key (docs/script-model.md)",
		strings.Join(slices.Compact(unset), ", "), map[bool]string{true: "is", false: "are"}[len(unset) == 1])
}

// unsetCredential stands for a credential whose environment variable is
// not set.
type unsetCredential struct{ provider, env string }

// Stream fails as a provider would, saying which variable is not set.
func (u unsetCredential) Stream(context.Context, model.Request) (model.Stream, error) {
	return nil, &model.Error{Provider: u.provider, Message: fmt.Sprintf("credential %s is not set in the environment", u.env)}
}

// toolUser resolves a tool's user: (nil without one) and checks that this
// process may start processes as it.
func toolUser(t config.Tool) (*runas.Identity, error) {
	if t.User == "" {
		return nil, nil
	}
	id, err := runas.Lookup(t.User)
	if err == nil {
		err = id.Check()
	}
	return id, err
}

// withApproval gives at what the agent file says of its approvals
// (approval, approval_timeout): remote is the server's name of one tool of
// an mcp entry, whose override beats the entry. A timeout that came from
// timeouts.approval is kept with its source, so that the agent lets it
// follow the turn's.
func withApproval(at agent.Tool, t config.Tool, remote string) agent.Tool {
	if required, timeout := t.ApprovalFor(remote); required {
		at.NeedsApproval = agent.ApprovalRequired
		at.ApprovalTimeout = timeout
	}
	return at
}

// buildTools builds every tool of the file. It goes on past a tool that
// fails (an MCP server that will not start, say) so that the error lists
// every one; the caller closes what was started.
func buildTools(ctx context.Context, cfg *config.Agent, a *Agent) ([]agent.Tool, error) {
	var out []agent.Tool
	var errs []error
	for _, t := range cfg.Tools {
		user, err := toolUser(t)
		if err != nil {
			where := t.UserWhere
			if where == "" {
				where = fmt.Sprintf("tools[%s].user", t.Name)
			}
			errs = append(errs, fmt.Errorf("%s: %w", where, err))
			continue
		}
		switch {
		case t.Exec != nil:
			et, err := exectool.New(exectool.Config{
				Spec: tool.Spec{Name: t.Name, Description: t.Description, InputSchema: t.InputSchema},
				Argv: t.Exec, Env: t.Env, Withhold: cfg.Withheld(), User: user, Workdir: t.Workdir,
			})
			if err != nil {
				errs = append(errs, fmt.Errorf("tools[%s]: %w", t.Name, err))
				continue
			}
			out = append(out, withApproval(agent.Tool{Tool: et, Budget: t.Budget, Retries: t.Retries}, t, ""))
		case t.MCP != nil:
			ts, closer, err := openMCP(ctx, t, cfg.Withheld(), user)
			if err != nil {
				errs = append(errs, fmt.Errorf("tools[%s]: %w", t.Name, err))
				continue
			}
			a.closers = append(a.closers, closer)
			out = append(out, ts...)
		}
	}
	return out, errors.Join(errs...)
}
