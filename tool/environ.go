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
