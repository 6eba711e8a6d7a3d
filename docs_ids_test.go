package timebox_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/internal/ids"
)

// idLike is what reads as a turn or session id in prose and examples.
var idLike = regexp.MustCompile(`\b[ts]_[A-Za-z0-9]{8,}\b`)

// TestDocsIDsHaveTheirRealForm: every turn or session id the README and
// the reference pages show has the form timebox gives them (t_ or s_ and
// 26 characters of base32), so that a reader who copies one, or writes a
// client that checks them, is not misled.
func TestDocsIDsHaveTheirRealForm(t *testing.T) {
	pages, _ := filepath.Glob("docs/*.md")
	pages = append(pages, "README.md")
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range idLike.FindAllString(string(b), -1) {
			if !ids.Is(id[:2], id) {
				t.Errorf("%s: %s is not an id of the form timebox gives (%s and 26 characters of A–Z, 2–7)", p, id, id[:2])
			}
		}
	}
}

// TestDocsSayTheIDForm: the pages that describe a turn or session id
// describe it as it is, and none says an older form (hex digits).
func TestDocsSayTheIDForm(t *testing.T) {
	for p, want := range map[string]string{
		"docs/http-api.md":               "`t_` and " + ids.Form,
		"docs/events.md":                 "`t_` and " + ids.Form,
		"docs/decisions/server-turns.md": "`s_` and " + ids.Form,
		"server/openapi.json":            "`t_` and " + ids.Form,
	} {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), want) {
			t.Errorf("%s does not describe the ids as %q", p, want)
		}
	}
	pages := allPages(t)
	if b, err := os.ReadFile("server/openapi.json"); err == nil {
		pages["server/openapi.json"] = b
	}
	for p, b := range pages {
		if m := hexForm.Find(b); m != nil {
			t.Errorf("%s describes an id as %q; ids are %s", p, m, ids.Form)
		}
	}
}

// hexForm is how the pages once described ids.
var hexForm = regexp.MustCompile("`[ts]_`[^.|\n]{0,8}hex")
