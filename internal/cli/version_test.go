package cli

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFormatVersion(t *testing.T) {
	cases := []struct {
		name string
		bi   *debug.BuildInfo
		want []string
	}{
		{"a build from a clone", &debug.BuildInfo{Main: debug.Module{Path: "github.com/timebox-run/timebox", Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "75f8583c1d2e"}, {Key: "vcs.time", Value: "2026-11-23T19:00:00Z"}, {Key: "vcs.modified", Value: "true"}}},
			[]string{"timebox 0.1.0\n", "commit   75f8583c1d2e (2026-11-23T19:00:00Z), with uncommitted changes\n", "go       go1.26.8 linux/amd64\n"}},
		{"a clean build", &debug.BuildInfo{Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "75f8583c1d2e"}, {Key: "vcs.modified", Value: "false"}}},
			[]string{"commit   75f8583c1d2e\n"}},
		{"go install @version", &debug.BuildInfo{Main: debug.Module{Path: "github.com/timebox-run/timebox", Version: "v0.0.0-20261123190000-75f8583c1d2e"}},
			[]string{"module   github.com/timebox-run/timebox v0.0.0-20261123190000-75f8583c1d2e\n"}},
		{"no build info", nil, []string{"commit   unknown (built without VCS information"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := formatVersion("0.1.0", tc.bi, "go1.26.8", "linux/amd64")
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("version text\n%s\nlacks %q", got, w)
				}
			}
			if tc.name == "a clean build" && strings.Contains(got, "uncommitted") {
				t.Errorf("a clean tree called modified:\n%s", got)
			}
		})
	}
}
