package cli

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/timebox-run/timebox"
)

// versionText is what `timebox version` prints: the release, the commit
// the binary was built from and whether its tree had uncommitted changes,
// the module version when it was installed with `go install …@version`,
// and the Go toolchain.
func versionText() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		bi = nil
	}
	return formatVersion(timebox.Version, bi, runtime.Version(), runtime.GOOS+"/"+runtime.GOARCH)
}

func formatVersion(release string, bi *debug.BuildInfo, goVersion, platform string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "timebox %s\n", release)
	var rev, when string
	var modified bool
	if bi != nil {
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.time":
				when = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
	}
	switch {
	case rev != "":
		fmt.Fprintf(&b, "commit   %s", rev)
		if when != "" {
			fmt.Fprintf(&b, " (%s)", when)
		}
		if modified {
			b.WriteString(", with uncommitted changes")
		}
		b.WriteString("\n")
	case bi != nil && bi.Main.Version != "" && bi.Main.Version != "(devel)":
		// `go install …@version` builds from the module cache, without
		// VCS information; a pseudo-version names the commit itself.
		fmt.Fprintf(&b, "module   %s %s\n", bi.Main.Path, bi.Main.Version)
	default:
		b.WriteString("commit   unknown (built without VCS information, such as with -buildvcs=false)\n")
	}
	fmt.Fprintf(&b, "go       %s %s\n", goVersion, platform)
	return b.String()
}
