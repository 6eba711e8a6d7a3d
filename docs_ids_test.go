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

// TestDocsSayTheIDForm: the HTTP reference describes a turn id as it is.
func TestDocsSayTheIDForm(t *testing.T) {
	b, err := os.ReadFile("docs/http-api.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := "`t_` and " + ids.Form; !strings.Contains(string(b), want) {
		t.Errorf("docs/http-api.md does not describe turn ids as %q", want)
	}
}
