// Package runas resolves the user a tool runs as (tools[].user), the way
// systemd's User= and Group= do: a user by name or uid, with its primary
// group unless a group is given, its supplementary groups, and its home
// directory and name for the variables HOME, USER and LOGNAME.
//
// A Go program that builds an exec tool (exectool.Config.User) or an MCP
// server (mcptool.Config.User) itself resolves its user with Lookup and
// checks with Identity.Check that this process may start processes as it;
// timebox.New does both for an agent file's tools[].user.
package runas

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"slices"
	"strconv"
	"strings"
)

// Identity is a resolved user and group.
type Identity struct {
	// Spec is what the file said: NAME, NAME:GROUP, UID or UID:GID.
	Spec string
	// Name is the user's login name and Home its home directory, from the
	// user database: Environ sets them as USER, LOGNAME and HOME.
	Name string
	Home string
	// UID is the user's id, and GID the group's: the one Spec names, else
	// the user's primary group.
	UID uint32
	GID uint32
	// Groups are the user's supplementary groups.
	Groups []uint32
}

// CheckSpec checks spec's form only: USER or USER:GROUP, neither empty.
func CheckSpec(spec string) error {
	u, g, hasGroup := strings.Cut(spec, ":")
	if u == "" || (hasGroup && (g == "" || strings.Contains(g, ":"))) {
		return fmt.Errorf("%q is not USER or USER:GROUP (a name or a number each)", spec)
	}
	return nil
}

// Lookup resolves spec (NAME, NAME:GROUP, UID, UID:GID; a group by name
// or id). It returns an error naming what does not exist.
func Lookup(spec string) (*Identity, error) {
	if err := CheckSpec(spec); err != nil {
		return nil, err
	}
	uname, gname, hasGroup := strings.Cut(spec, ":")
	u, err := user.Lookup(uname)
	if err != nil {
		if _, nerr := strconv.Atoi(uname); nerr == nil {
			u, err = user.LookupId(uname)
		}
		var unknownName user.UnknownUserError
		var unknownID user.UnknownUserIdError
		switch {
		case errors.As(err, &unknownName) || errors.As(err, &unknownID):
			return nil, fmt.Errorf("no user %q on this machine", uname)
		case err != nil:
			return nil, fmt.Errorf("looking up user %q: %v", uname, err)
		}
	}
	id := &Identity{Spec: spec, Name: u.Username, Home: u.HomeDir}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("user %q has uid %q, not a number (this platform runs no tool as another user)", uname, u.Uid)
	}
	id.UID = uint32(uid)
	gid := u.Gid
	if hasGroup {
		g, err := user.LookupGroup(gname)
		if err != nil {
			if _, nerr := strconv.Atoi(gname); nerr == nil {
				g, err = user.LookupGroupId(gname)
			}
			if err != nil {
				return nil, fmt.Errorf("no group %q on this machine", gname)
			}
		}
		gid = g.Gid
	}
	n, err := strconv.ParseUint(gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("group %q is not a number", gid)
	}
	id.GID = uint32(n)
	if gids, err := u.GroupIds(); err == nil {
		// GroupIds has the user's primary group always. With a group
		// given, systemd's initgroups(user, group) keeps it only if the
		// group file lists the user in it: the group given replaces it.
		var listed map[string]bool
		if hasGroup {
			listed = listedIn(groupFile, u.Username)
		}
		for _, g := range gids {
			if hasGroup && g == u.Gid && !listed[g] {
				continue
			}
			if n, err := strconv.ParseUint(g, 10, 32); err == nil && uint32(n) != id.GID {
				id.Groups = append(id.Groups, uint32(n))
			}
		}
	}
	return id, nil
}

// groupFile is the group database listedIn reads; tests replace it.
var groupFile = "/etc/group"

// listedIn returns the ids of the groups whose member list in the group
// file at path (name:password:gid:member,member…) has name. An unreadable
// file lists nobody.
func listedIn(path, name string) map[string]bool {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	out := map[string]bool{}
	for line := range strings.Lines(string(b)) {
		f := strings.Split(strings.TrimRight(line, "\r\n"), ":")
		if len(f) == 4 && slices.Contains(strings.Split(f[3], ","), name) {
			out[f[2]] = true
		}
	}
	return out
}

// Check reports whether this process may start processes as id: it must
// run as root, unless id is who it already is.
func (id *Identity) Check() error {
	euid, egid := geteuid(), os.Getegid()
	if euid == 0 || (uint32(euid) == id.UID && uint32(egid) == id.GID) {
		return nil
	}
	return fmt.Errorf("running a tool as %s needs timebox to run as root (it runs as uid %d); remove user:, or start timebox as root", id.Spec, euid)
}

// geteuid is os.Geteuid; tests replace it.
var geteuid = os.Geteuid

// Environ sets HOME, USER and LOGNAME in env to id's, as a login would.
func (id *Identity) Environ(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		name, _, _ := strings.Cut(kv, "=")
		if name != "HOME" && name != "USER" && name != "LOGNAME" {
			out = append(out, kv)
		}
	}
	return append(out, "HOME="+id.Home, "USER="+id.Name, "LOGNAME="+id.Name)
}
