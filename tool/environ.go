package tool

import (
	"os"
	"slices"
	"strings"
)

// Environ returns the environment a tool's process inherits from this
// process: only the variables allow names that are set, when allow is not
// nil (an empty allow passes none); otherwise every variable but those
// withhold names — timebox's own secrets and its providers' credentials
// (config.Agent.Withheld). Exec tools and stdio MCP servers both start
// with it.
func Environ(allow, withhold []string) []string {
	if allow != nil {
		out := make([]string, 0, len(allow))
		for _, name := range allow {
			if v, ok := os.LookupEnv(name); ok {
				out = append(out, name+"="+v)
			}
		}
		return out
	}
	env := os.Environ()
	if len(withhold) == 0 {
		return env
	}
	out := env[:0]
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if !slices.Contains(withhold, name) {
			out = append(out, kv)
		}
	}
	return out
}

// EnvTraceParent is the variable that carries a traced call's W3C
// traceparent into a subprocess (the OpenTelemetry convention for
// environment carriers).
const EnvTraceParent = "TRACEPARENT"

// WithTraceParent returns env with TRACEPARENT set to traceparent, in place
// of any it inherited.
func WithTraceParent(env []string, traceparent string) []string {
	out := make([]string, 0, len(env)+1)
	for _, kv := range env {
		if !strings.HasPrefix(kv, EnvTraceParent+"=") {
			out = append(out, kv)
		}
	}
	return append(out, EnvTraceParent+"="+traceparent)
}
