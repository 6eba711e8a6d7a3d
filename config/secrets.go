package config

import (
	"slices"
	"sort"
	"strings"
)

// OwnSecrets are the variables of timebox's own that hold secrets, or
// say where one is: the server's token, the store's URL (a PostgreSQL
// password may be in it), what pgx reads as libpq does (the password, the
// client key's password, the password file), and the headers OpenTelemetry's
// exporter sends to a collector (an API key, as a rule). A tool never
// inherits them unless its entry names them in env: (Agent.Withheld).
var OwnSecrets = []string{"TIMEBOX_TOKEN", "TIMEBOX_DB", "PGPASSWORD", "PGSSLPASSWORD", "PGPASSFILE",
	"OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS"}

// Withheld returns the variables an exec tool or a stdio MCP server
// without env: does not inherit — timebox's own secrets, the default
// credential variables of the providers timebox knows (OPENAI_API_KEY,
// ANTHROPIC_API_KEY: set in timebox's environment whether or not this
// file uses them), the credential variables of every provider the file
// configures, the variables that hold webhook secrets (server.webhooks),
// and what a stdio MCP entry's env: hands its server (but the
// common variables every program reads, CommonEnv: a server's GITHUB_TOKEN
// is that server's, its PATH everyone's) — sorted.
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
	for _, w := range a.Server.Webhooks {
		if !slices.Contains(out, w.SecretEnv) {
			out = append(out, w.SecretEnv)
		}
	}
	for _, t := range a.Tools {
		if t.MCP == nil {
			continue
		}
		for _, env := range t.MCP.Env {
			if !commonEnv(env) && !slices.Contains(out, env) {
				out = append(out, env)
			}
		}
	}
	sort.Strings(out)
	return out
}

// CommonEnv are the variables of the environment every program reads
// (locale, paths, terminal, proxies), never taken for an MCP server's
// credentials; so are those that begin with LC_ or XDG_.
var CommonEnv = []string{"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR",
	"PWD", "HOSTNAME", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy",
	"SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_OPTIONS", "NODE_PATH", "PYTHONPATH", "VIRTUAL_ENV"}

func commonEnv(name string) bool {
	return slices.Contains(CommonEnv, name) || strings.HasPrefix(name, "LC_") || strings.HasPrefix(name, "XDG_")
}
