package tool_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/tool"
)

// TestEnviron: without an allowlist a tool inherits everything but what
// timebox withholds; an allowlist passes exactly what it names, withheld
// or not; an empty one passes nothing.
func TestEnviron(t *testing.T) {
	t.Setenv("TIMEBOX_TOKEN", "s3cret")
	t.Setenv("OPENAI_API_KEY", "sk-live")
	t.Setenv("TB_PLAIN", "plain")
	withhold := []string{"OPENAI_API_KEY", "TIMEBOX_TOKEN"}
	names := func(env []string) []string {
		var out []string
		for _, kv := range env {
			n, _, _ := strings.Cut(kv, "=")
			out = append(out, n)
		}
		return out
	}
	all := names(tool.Environ(nil, withhold))
	if slices.Contains(all, "TIMEBOX_TOKEN") || slices.Contains(all, "OPENAI_API_KEY") || !slices.Contains(all, "TB_PLAIN") {
		t.Errorf("without env: %v", all)
	}
	if got := tool.Environ([]string{"OPENAI_API_KEY", "TB_PLAIN", "TB_UNSET"}, withhold); !slices.Equal(got, []string{"OPENAI_API_KEY=sk-live", "TB_PLAIN=plain"}) {
		t.Errorf("env: [OPENAI_API_KEY, TB_PLAIN, TB_UNSET] gave %v", got)
	}
	if got := tool.Environ([]string{}, withhold); len(got) != 0 {
		t.Errorf("env: [] gave %v", got)
	}
}
