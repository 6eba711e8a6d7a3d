package runas

import (
	"os"
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

// TestAGroupGivenReplacesThePrimaryGroup: with USER:GROUP the user's own
// primary group is not among its groups unless the group file lists the
// user in it, as systemd's User= with Group= (initgroups) has it.
func TestAGroupGivenReplacesThePrimaryGroup(t *testing.T) {
	dir := t.TempDir()
	groupFile = dir + "/group"
	t.Cleanup(func() { groupFile = "/etc/group" })
	write := func(text string) {
		if err := os.WriteFile(groupFile, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("root:x:0:\nnogroup:x:65534:\n")
	id, err := Lookup("root:65534")
	if err != nil {
		t.Fatal(err)
	}
	if id.GID != 65534 || slices.Contains(id.Groups, 0) {
		t.Errorf("root:65534 runs with gid %d, groups %v; want 65534, and not root's own group 0", id.GID, id.Groups)
	}
	write("root:x:0:daemon,root\n")
	if id, err := Lookup("root:65534"); err != nil || !slices.Contains(id.Groups, 0) {
		t.Errorf("root listed in group 0: groups %v (%v); want 0 kept", id.Groups, err)
	}
	if id, err := Lookup("root"); err != nil || id.GID != 0 {
		t.Errorf("root alone: %+v, %v", id, err)
	}
}

func TestListedIn(t *testing.T) {
	path := t.TempDir() + "/group"
	os.WriteFile(path, []byte("a:x:1:bob,alice\nb:x:2:alice\r\nc:x:3:\nbad line\n"), 0o644)
	if got := listedIn(path, "bob"); len(got) != 1 || !got["1"] {
		t.Errorf("bob: %v", got)
	}
	if got := listedIn(path, "alice"); len(got) != 2 || !got["1"] || !got["2"] {
		t.Errorf("alice: %v", got)
	}
	if got := listedIn(path+".none", "bob"); got != nil {
		t.Errorf("no file: %v", got)
	}
}
