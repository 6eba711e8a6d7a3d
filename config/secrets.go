package config

import (
	"slices"
	"sort"
)

// OwnSecrets are the variables of timebox's own that hold secrets: the
// server's token, the store's URL (a PostgreSQL password may be in it)
// and the password libpq and pgx read. A tool never inherits them unless
// its entry names them in env: (Agent.Withheld).
var OwnSecrets = []string{"TIMEBOX_TOKEN", "TIMEBOX_DB", "PGPASSWORD"}

// Withheld returns the variables an exec tool or a stdio MCP server
// without env: does not inherit — timebox's own secrets, the default
// credential variables of the providers timebox knows (OPENAI_API_KEY,
// ANTHROPIC_API_KEY: set in timebox's environment whether or not this
// file uses them) and the credential variables of every provider the
// file configures — sorted.
// Every other variable passes; a tool whose entry names one of these in
// env: gets it.
func (a *Agent) Withheld() []string {
	out := slices.Clone(OwnSecrets)
	for _, env := range defaultKeyEnv {
		if !slices.Contains(out, env) {
			out = append(out, env)
		}
	}
	for _, p := range a.Providers {
		for _, c := range p.Credentials {
			if c.APIKeyEnv != "" && !slices.Contains(out, c.APIKeyEnv) {
				out = append(out, c.APIKeyEnv)
			}
		}
	}
	sort.Strings(out)
	return out
}
