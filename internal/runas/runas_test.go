package runas

import (
	"slices"
	"strings"
	"testing"
)

func TestLookup(t *testing.T) {
	root, err := Lookup("root")
	if err != nil || root.UID != 0 || root.GID != 0 || root.Name != "root" {
		t.Fatalf("root: %+v, %v", root, err)
	}
	if byID, err := Lookup("0:0"); err != nil || byID.UID != 0 || byID.Name != "root" {
		t.Errorf("0:0: %+v, %v", byID, err)
	}
	for spec, says := range map[string]string{
		"no-such-user-tb": `no user "no-such-user-tb"`,
		"root:no-such-g":  `no group "no-such-g"`,
		":wheel":          "is not USER or USER:GROUP",
		"root:":           "is not USER or USER:GROUP",
	} {
		if _, err := Lookup(spec); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%q: %v, want an error saying %q", spec, err, says)
		}
	}
}

// TestCheck: only root may start a process as someone else; anyone may as
// themselves.
func TestCheck(t *testing.T) {
	defer func(f func() int) { geteuid = f }(geteuid)
	other := &Identity{Spec: "nobody", UID: 65534, GID: 65534}
	geteuid = func() int { return 0 }
	if err := other.Check(); err != nil {
		t.Errorf("as root: %v", err)
	}
	geteuid = func() int { return 1000 }
	if err := other.Check(); err == nil || !strings.Contains(err.Error(), "needs timebox to run as root (it runs as uid 1000)") {
		t.Errorf("as uid 1000: %v", err)
	}
}

func TestEnviron(t *testing.T) {
	id := &Identity{Name: "svc", Home: "/srv/svc"}
	got := id.Environ([]string{"HOME=/root", "PATH=/bin", "USER=root", "LOGNAME=root"})
	slices.Sort(got)
	if want := []string{"HOME=/srv/svc", "LOGNAME=svc", "PATH=/bin", "USER=svc"}; !slices.Equal(got, want) {
		t.Errorf("%v, want %v", got, want)
	}
}
