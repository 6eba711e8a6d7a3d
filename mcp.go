package timebox

import (
	"context"
	"fmt"

	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/config"
	"github.com/timebox-run/timebox/tool/mcptool"
	"github.com/timebox-run/timebox/tool/runas"
)

// OpenMCP starts the server of an mcp tool entry and lists its tools, each
// with its resolved budget (the entry's, with the tool's override applied).
// The caller must Close the server; every process it started is gone when
// Close returns. It returns an error when the server cannot be started, does
// not answer within mcptool.DefaultStartTimeout, or when an override names
// a tool the server does not have.
//
// withhold names the variables a stdio server without env: does not
// inherit (config.Agent.Withheld). The server runs as t.User when it is
// set (tools[].user); OpenMCP returns an error, naming the fix, when that
// user does not exist or this process may not start processes as it.
func OpenMCP(ctx context.Context, t config.Tool, withhold []string) (*mcptool.Server, error) {
	user, err := toolUser(t)
	if err != nil {
		return nil, fmt.Errorf("tools[%s].user: %w", t.Name, err)
	}
	return openMCPServer(ctx, t, withhold, user)
}

// openMCPServer is OpenMCP with the user resolved.
func openMCPServer(ctx context.Context, t config.Tool, withhold []string, user *runas.Identity) (*mcptool.Server, error) {
	m := t.MCP
	overrides := make(map[string]mcptool.Override, len(m.Overrides))
	for name, o := range m.Overrides {
		overrides[name] = mcptool.Override{Timeout: o.Timeout, IdleTimeout: o.IdleTimeout, Enforcement: o.Enforcement}
	}
	return mcptool.Open(ctx, mcptool.Config{
		Name:     t.Name,
		Command:  m.Command,
		Env:      m.Env,
		Withhold: withhold,
		User:     user,
		// config fills Workdir for exec entries only; an mcp entry's server
		// runs where timebox runs until it does the same for them.
		Dir:       t.Workdir,
		URL:       m.URL,
		Headers:   m.Headers,
		Budget:    t.Budget,
		Overrides: overrides,
		// A server that goes on with a cancelled call is restarted
		// (mcp.on_ignored_cancel: restart; config allows it for stdio
		// servers only).
		RestartOnIgnoredCancel: m.OnIgnoredCancel == config.OnIgnoredCancelRestart,
	})
}

// openMCP starts an mcp entry's server and returns its tools as the agent
// takes them, with the closer that stops the server.
func openMCP(ctx context.Context, t config.Tool, withhold []string, user *runas.Identity) ([]agent.Tool, func() error, error) {
	s, err := openMCPServer(ctx, t, withhold, user)
	if err != nil {
		return nil, nil, err
	}
	var out []agent.Tool
	for _, tl := range s.Tools() {
		out = append(out, withApproval(agent.Tool{Tool: tl, Budget: tl.Budget(), Retries: t.Retries}, t, tl.RemoteName()))
	}
	return out, s.Close, nil
}
