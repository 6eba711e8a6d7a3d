package config

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml/ast"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/tool"
	"github.com/timebox-run/timebox/tool/runas"
)

var (
	// profileNameRE starts with a letter so that a profile name can never
	// be mistaken for a duration.
	profileNameRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9_-]{0,63}$`)
	// plainArgRE is an argv item that needs no quotes in a YAML flow list.
	plainArgRE = regexp.MustCompile(`^[A-Za-z0-9_./=+-][A-Za-z0-9_./=+@:-]*$`)
)

var toolKeys = []string{"name", "description", "input_schema", "exec", "mcp", "timeout", "idle_timeout", "enforcement", "approval", "approval_timeout", "env", "workdir", "user", "overrides", "retries"}

// MaxRetries is the most retries a tool may declare (Tool.Retries).
const MaxRetries = 5

// toolHint catches keys that belong elsewhere, or that other runtimes
// spell differently.
func toolHint(key string) string {
	switch key {
	case "command", "url", "headers":
		return fmt.Sprintf(" (%s goes inside mcp: {%s: ...})", key, key)
	case "args", "argv", "cmd", "run", "shell":
		return " (did you mean exec? it is an argv list, such as [./tools/x.sh, --flag])"
	case "timeout_ms", "timeout_seconds", "timeoutSeconds", "default_timeout":
		return " (did you mean timeout? it takes a Go duration, such as 30s)"
	}
	return approvalHint(key)
}

// approvalHint catches the ways other runtimes ask for a person's
// decision.
func approvalHint(key string) string {
	switch key {
	case "requires_approval", "require_approval", "needs_approval", "confirm", "human_approval":
		return " (did you mean approval? such as approval: required)"
	}
	return ""
}

// rawTool is a tool entry as the file gives it, before the process-wide
// settings it depends on (tool, tool_max, profiles) are resolved.
type rawTool struct {
	path string // "tools[2]"
	at   pos
	t    Tool
	ok   bool // the entry is usable enough to resolve

	timeout   *rawTimeout
	idle      *rawDuration
	enf       budget.Enforcement
	approval  rawApproval
	overrides []rawOverride
}

// rawApproval is what an entry or an override says of approvals: its
// approval ("" when it does not say) and its approval_timeout.
type rawApproval struct {
	approval Approval
	timeout  *rawDuration
	// timeoutKeyAt is where approval_timeout is written, for the error of
	// one that no call would wait by.
	timeoutKeyAt pos
}

// rawTimeout is a tool's own timeout: a duration or a profile name, which
// can only be told apart once the profiles are known.
type rawTimeout struct {
	v    value
	at   pos
	path string
}

type rawDuration struct {
	d  time.Duration
	at pos
}

type rawOverride struct {
	name     string
	path     string
	timeout  *rawTimeout
	idle     *rawDuration
	enf      budget.Enforcement
	approval rawApproval
}

func (l *loader) decodeTools(e entry) {
	items, _, ok := l.t.list(e.val, "tools", "")
	if !ok {
		return
	}
	names := map[string]string{}
	for i, item := range items {
		rt := &rawTool{path: fmt.Sprintf("tools[%d]", i), at: posOf(item)}
		l.decodeTool(rt, item)
		if rt.t.Name != "" {
			if prev, dup := names[rt.t.Name]; dup {
				l.errAt(rt.nameAt(l), rt.path+".name", fmt.Sprintf("%q is already the name of %s (tool names must be unique)", rt.t.Name, prev))
				rt.ok = false
			} else {
				names[rt.t.Name] = rt.path
			}
		}
		l.tools = append(l.tools, rt)
	}
}

// nameAt finds the position of an entry's name for a duplicate report.
func (rt *rawTool) nameAt(l *loader) pos {
	if p, ok := l.toolNamePos[rt.path]; ok {
		return p
	}
	return rt.at
}

func (l *loader) decodeTool(rt *rawTool, item ast.Node) {
	es, ok := l.t.mapping(item, rt.path, "a tool entry (a mapping with name and exec or mcp)")
	if !ok {
		return
	}
	if len(es) == 0 {
		l.errAt(rt.at, rt.path, "is empty (give at least name and exec or mcp)")
		return
	}
	rt.ok = true
	fs := l.t.fields(es, rt.path, toolKeys, toolHint)
	key := func(k string) string { return rt.path + "." + k }

	if ne, ok := fs["name"]; ok {
		s, at, ok := l.t.str(ne.val, key("name"), "a name")
		l.toolNamePos[rt.path] = at
		switch {
		case !ok:
			rt.ok = false
		case !tool.NameRE.MatchString(s):
			l.errAt(at, key("name"), fmt.Sprintf("%q is not a valid tool name (use letters, digits, _ and -, at most 64, such as %s)", s, sanitizeName(s)))
			rt.ok = false
		default:
			rt.t.Name = s
		}
	} else {
		l.errAt(rt.at, key("name"), "missing: every tool needs a name (such as name: web_fetch)")
		rt.ok = false
	}

	_, hasExec := fs["exec"]
	_, hasMCP := fs["mcp"]
	switch {
	case hasExec && hasMCP:
		second := fs["mcp"]
		if fs["exec"].keyAt.line > second.keyAt.line || (fs["exec"].keyAt.line == second.keyAt.line && fs["exec"].keyAt.col > second.keyAt.col) {
			second = fs["exec"]
		}
		l.errAt(second.keyAt, rt.path, "has both exec and mcp (keep one: exec runs a program for each call, mcp connects to a server)")
		rt.ok = false
	case !hasExec && !hasMCP:
		l.errAt(rt.at, rt.path, "needs exec (a program to run, such as exec: [./tools/x.sh]) or mcp (a server, such as mcp: {command: [npx, -y, server]})")
		rt.ok = false
	case hasExec:
		rt.t.Kind = tool.KindExec
		if argv, ok := l.argv(fs["exec"], key("exec"), "exec"); ok {
			rt.t.Exec = argv
		} else {
			rt.ok = false
		}
	default:
		rt.t.Kind = tool.KindMCP
		if m, ok := l.decodeMCP(fs["mcp"], key("mcp")); ok {
			rt.t.MCP = m
		} else {
			rt.ok = false
		}
	}

	// Keys that only make sense for one kind: a setting that would be
	// ignored is a typo that becomes a default, which spec §10 forbids.
	only := func(k string, kind tool.Kind, why string) {
		if e, ok := fs[k]; ok && rt.t.Kind != "" && rt.t.Kind != kind {
			l.errAt(e.keyAt, key(k), why)
			rt.ok = false
		}
	}
	only("description", tool.KindExec, "applies to exec tools only (an MCP server describes its own tools)")
	only("input_schema", tool.KindExec, "applies to exec tools only (an MCP server gives each tool's schema)")
	only("workdir", tool.KindExec, "applies to exec tools only")
	only("overrides", tool.KindMCP, "applies to mcp entries only (they set budgets of the server's tools by name)")

	if de, ok := fs["description"]; ok {
		rt.t.Description, _, _ = l.t.str(de.val, key("description"), "a description")
	}
	if se, ok := fs["input_schema"]; ok && rt.t.Kind != tool.KindMCP {
		rt.t.InputSchema = l.schema(se, key("input_schema"))
	}
	if te, ok := fs["timeout"]; ok {
		v, at, ok := l.t.scalar(te.val, key("timeout"), "a duration or a profile name")
		if ok {
			rt.timeout = &rawTimeout{v: v, at: at, path: key("timeout")}
		}
	}
	if ie, ok := fs["idle_timeout"]; ok {
		rt.idle = l.idleTimeout(ie, key("idle_timeout"))
	}
	if ee, ok := fs["enforcement"]; ok {
		rt.enf = l.enforcement(ee, key("enforcement"))
	}
	rt.approval = l.decodeApproval(fs, rt.path)
	if ee, ok := fs["env"]; ok {
		env := l.envList(ee, key("env"))
		if rt.t.MCP != nil {
			rt.t.MCP.Env = env
		} else {
			rt.t.Env = env
		}
	}
	if we, ok := fs["workdir"]; ok && rt.t.Kind != tool.KindMCP {
		s, at, ok := l.t.str(we.val, key("workdir"), "a directory")
		if ok {
			abs := l.abs(s)
			if fi, err := os.Stat(abs); err != nil {
				l.errAt(at, key("workdir"), fmt.Sprintf("%q does not exist (relative paths are relative to the agent file's directory)", s))
			} else if !fi.IsDir() {
				l.errAt(at, key("workdir"), fmt.Sprintf("%q is not a directory", s))
			}
			rt.t.Workdir = abs
		}
	}
	if ue, ok := fs["user"]; ok {
		s, at, ok := l.t.str(ue.val, key("user"), "a user: NAME, NAME:GROUP, UID or UID:GID")
		switch {
		case !ok:
		case rt.t.MCP != nil && len(rt.t.MCP.Command) == 0:
			l.errAt(ue.keyAt, key("user"), "applies to exec tools and stdio MCP servers only (a url server runs elsewhere)")
		default:
			// The user is looked up, and timebox's right to run as it
			// checked, when the agent is built (timebox.Build): the file
			// may be written on one machine for another.
			if err := runas.CheckSpec(s); err != nil {
				l.errAt(at, key("user"), err.Error())
			}
			rt.t.User = s
			rt.t.UserWhere = fmt.Sprintf("%s:%d:%d: %s", l.path, at.line, at.col, key("user"))
		}
	}
	if re, ok := fs["retries"]; ok {
		rt.t.Retries = l.retries(re, key("retries"))
	}
	if oe, ok := fs["overrides"]; ok && rt.t.Kind != tool.KindExec {
		rt.overrides = l.decodeOverrides(oe, key("overrides"))
	}
}

// retries reads a tool's retries: a whole number from 0 to MaxRetries.
func (l *loader) retries(e entry, path string) int {
	v, at, ok := l.t.scalar(e.val, path, "a whole number of retries")
	if !ok {
		return 0
	}
	n, err := strconv.Atoi(v.text)
	if err != nil || !v.number || n < 0 || n > MaxRetries {
		l.errAt(at, path, fmt.Sprintf("%q: give a whole number from 0 to %d (only for a tool whose calls are safe to run twice; 0, the default, never runs a call again)", v.text, MaxRetries))
		return 0
	}
	return n
}

// sanitizeName turns an invalid tool name into a valid one for the fix.
func sanitizeName(s string) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_', r == '-':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
		if b.Len() >= 64 {
			break
		}
	}
	out := strings.Trim(b.String(), "_")
	if out == "" {
		return "my_tool"
	}
	return out
}

// argv reads a program and its arguments. A plain string is refused: it
// would have to be split, and splitting is a shell's job that timebox
// never does (spec §9).
func (l *loader) argv(e entry, path, field string) ([]string, bool) {
	r, ok := l.t.resolve(e.val, path)
	if !ok {
		return nil, false
	}
	switch r.n.(type) {
	case *ast.StringNode, *ast.LiteralNode:
		l.errAt(r.at, path, fmt.Sprintf("%s is an argv list, never a shell string: use %s", field, argvFix(nodeText(r.n))))
		return nil, false
	}
	items, at, ok := l.t.list(e.val, path, "")
	if !ok {
		return nil, false
	}
	if len(items) == 0 {
		l.errAt(at, path, "is empty (give the program and its arguments, such as [./tools/x.sh, --flag])")
		return nil, false
	}
	argv := make([]string, 0, len(items))
	ok = true
	for i, item := range items {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		s, iat, iok := l.t.str(item, ipath, "a string")
		if !iok {
			ok = false
			continue
		}
		if strings.ContainsRune(s, 0) {
			// No program or argument can hold one: the system ends the
			// string there.
			l.errAt(iat, ipath, fmt.Sprintf("%s holds a NUL character (\\0), which no program name or argument can hold (remove it)", strconv.Quote(s)))
			ok = false
			continue
		}
		if i == 0 {
			s, iok = l.program(s, iat, ipath)
			ok = ok && iok
		}
		argv = append(argv, s)
	}
	return argv, ok
}

// program checks an argv's program as it will be run. One with a slash is
// a path, made absolute against the agent file's directory; one without is
// looked up in PATH as exec does when the tool runs, in timebox's own
// environment (the PATH of Overrides.Env; not checked when it has none, so
// that tests and library callers stay hermetic). Either must be a regular
// file that is executable.
func (l *loader) program(s string, at pos, path string) (string, bool) {
	if strings.TrimSpace(s) == "" {
		l.errAt(at, path, "the program is empty (such as ./tools/x.sh)")
		return s, false
	}
	if runtime.GOOS != "windows" && strings.Contains(s, `\`) {
		// A Windows path: here it is a program's name with backslashes
		// in it, looked up in PATH.
		fixed := strings.ReplaceAll(s, `\`, "/")
		if !strings.HasPrefix(fixed, "/") && !strings.HasPrefix(fixed, "./") && !strings.HasPrefix(fixed, "../") {
			fixed = "./" + fixed
		}
		l.errAt(at, path, fmt.Sprintf("%q has backslashes: write paths with / (such as %s), as on every system timebox runs on", s, fixed))
		return s, false
	}
	if !strings.Contains(s, "/") {
		if problem := l.lookPath(s); problem != "" {
			l.errAt(at, path, problem)
			return s, false
		}
		return s, true
	}
	abs := l.abs(s)
	if problem := fileProblem(s, abs); problem != "" {
		l.errAt(at, path, problem)
		return abs, false
	}
	if fi, err := os.Stat(abs); err == nil && fi.Mode()&0o111 == 0 {
		l.errAt(at, path, fmt.Sprintf("%q is not executable (chmod +x %s)", s, shellPath(abs)))
		return abs, false
	}
	if problem := l.scriptProblem(s, abs); problem != "" {
		l.errAt(at, path, problem)
		return abs, false
	}
	return abs, true
}

// scriptProblem says why the program file at abs (s as written) cannot be
// run, though it is an executable file: it is empty, or neither a binary
// nor a script with a #! line (exec does not hand such a file to a shell,
// as a shell does), or its #! line ends in a carriage return (a file
// saved with Windows line endings), or names an interpreter that is not
// there. Each of these would fail every call of the tool. Not checked on
// Windows, which runs programs by their extension.
func (l *loader) scriptProblem(s, abs string) string {
	if runtime.GOOS == "windows" {
		return ""
	}
	f, err := os.Open(abs)
	if err != nil {
		return ""
	}
	defer f.Close()
	head := make([]byte, 512)
	n, _ := io.ReadFull(f, head)
	head = head[:n]
	switch {
	case n == 0:
		return fmt.Sprintf("%q is empty, so it cannot be run (give it a #! line and its commands)", s)
	case isBinary(head):
		return ""
	case !bytes.HasPrefix(head, []byte("#!")):
		return fmt.Sprintf("%q has no #! line, so it cannot be run as a program (make its first line #!/bin/sh, or the interpreter it needs)", s)
	}
	line, _, _ := bytes.Cut(head[2:], []byte("\n"))
	if bytes.HasSuffix(line, []byte("\r")) {
		return fmt.Sprintf("%q has Windows line endings: its #! line ends in a carriage return, so no interpreter is found (convert it: sed -i 's/\\r$//' %s)", s, shellPath(abs))
	}
	fields := strings.Fields(string(line))
	if len(fields) == 0 {
		return fmt.Sprintf("%q has an empty #! line (name its interpreter, such as #!/bin/sh)", s)
	}
	interp := fields[0]
	if _, err := os.Stat(interp); filepath.IsAbs(interp) && err != nil {
		return fmt.Sprintf("%q asks for the interpreter %s, which is not there (install it, or change the #! line)", s, interp)
	}
	if filepath.Base(interp) == "env" && len(fields) > 1 && !strings.HasPrefix(fields[1], "-") {
		if problem := l.lookPath(fields[1]); problem != "" {
			return fmt.Sprintf("%q asks for the interpreter %s (#!%s), which is not found in PATH (install it, or change the #! line)", s, fields[1], strings.TrimSpace(string(line)))
		}
	}
	return ""
}

// isBinary reports whether head is the start of a program the system
// runs itself: ELF, Mach-O (either byte order, 32 or 64 bits, universal).
func isBinary(head []byte) bool {
	for _, magic := range [][]byte{{0x7f, 'E', 'L', 'F'}, {0xfe, 0xed, 0xfa, 0xce}, {0xfe, 0xed, 0xfa, 0xcf},
		{0xce, 0xfa, 0xed, 0xfe}, {0xcf, 0xfa, 0xed, 0xfe}, {0xca, 0xfe, 0xba, 0xbe}} {
		if bytes.HasPrefix(head, magic) {
			return true
		}
	}
	return false
}

// lookPath finds a program without a slash in the PATH of Overrides.Env as
// os/exec does (which also refuses a relative PATH entry), and says why it
// cannot be run, or "".
func (l *loader) lookPath(name string) string {
	pathVar, set := "", false
	for _, kv := range l.o.Env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathVar, set = v, true // the last one wins, as in exec.Cmd
		}
	}
	if !set {
		return ""
	}
	notExec := ""
	for _, dir := range filepath.SplitList(pathVar) {
		if dir == "" || !filepath.IsAbs(dir) {
			continue
		}
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || !fi.Mode().IsRegular() {
			continue
		}
		if fi.Mode()&0o111 != 0 {
			return ""
		}
		notExec = filepath.Join(dir, name)
	}
	if notExec != "" {
		return fmt.Sprintf("%q is found in PATH as %s, which is not executable (chmod +x %s)", name, notExec, notExec)
	}
	return fmt.Sprintf("%q is not found in PATH (install it, or give its path from the agent file's directory, such as ./%s)", name, name)
}

// argvFix splits a shell-looking string into the list it probably meant.
func argvFix(s string) string {
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return "[./tools/x.sh, --flag]"
	}
	for i, f := range fields {
		if !plainArgRE.MatchString(f) || isNumeric(f) {
			fields[i] = strconv.Quote(f)
		}
	}
	return "[" + strings.Join(fields, ", ") + "]"
}

func isNumeric(s string) bool {
	_, err := strconv.ParseFloat(s, 64)
	return err == nil
}

var mcpKeys = []string{"command", "url", "headers", "on_ignored_cancel"}

func (l *loader) decodeMCP(e entry, path string) (*MCP, bool) {
	es, ok := l.t.mapping(e.val, path, "a mapping with command or url")
	if !ok {
		return nil, false
	}
	fs := l.t.fields(es, path, mcpKeys, func(k string) string {
		switch k {
		case "env", "overrides", "timeout", "idle_timeout", "enforcement", "approval", "approval_timeout", "workdir", "user":
			return fmt.Sprintf(" (%s belongs to the tool entry, beside mcp:)", k)
		case "args":
			return " (put the arguments in command: [program, arg, ...])"
		}
		return ""
	})
	m := &MCP{}
	ok = true
	ce, hasCmd := fs["command"]
	ue, hasURL := fs["url"]
	switch {
	case hasCmd && hasURL:
		l.errAt(ue.keyAt, path, "has both command and url (keep one: command starts a stdio server, url connects to a streamable HTTP server)")
		ok = false
	case !hasCmd && !hasURL:
		l.errAt(e.keyAt, path, "needs command (a stdio server, such as [npx, -y, server]) or url (a streamable HTTP server)")
		ok = false
	case hasCmd:
		argv, aok := l.argv(ce, path+".command", "command")
		m.Command, ok = argv, aok
	default:
		s, at, sok := l.t.str(ue.val, path+".url", "a URL")
		if !sok {
			ok = false
			break
		}
		if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			l.errAt(at, path+".url", fmt.Sprintf("%q is not an http(s) URL (such as http://127.0.0.1:3000/mcp)", s))
			ok = false
		}
		m.URL = s
	}
	if he, hasHeaders := fs["headers"]; hasHeaders {
		if hasCmd {
			l.errAt(he.keyAt, path+".headers", "applies to url servers only")
			ok = false
		}
		hes, hok := l.t.mapping(he.val, path+".headers", "a mapping of header names to values")
		if hok && len(hes) > 0 {
			m.Headers = map[string]string{}
		}
		for _, h := range hes {
			v, _, vok := l.t.str(h.val, path+".headers."+h.key, "a header value")
			if vok {
				m.Headers[h.key] = v
			}
		}
	}
	if oe, has := fs["on_ignored_cancel"]; has {
		v, at, vok := l.t.str(oe.val, path+".on_ignored_cancel", "keep or restart")
		switch {
		case !vok:
			ok = false
		case !slices.Contains(OnIgnoredCancelNames, v):
			hint := didYouMean(v, OnIgnoredCancelNames)
			if hint == "" {
				hint = " (use keep, the default, or restart)"
			}
			l.errAt(at, path+".on_ignored_cancel", fmt.Sprintf("%q is not what to do with a server that ignores a cancel%s", v, hint))
			ok = false
		case v == OnIgnoredCancelRestart && !hasCmd:
			l.errAt(at, path+".on_ignored_cancel", "restart applies to stdio servers (command) only: a url server's process is not timebox's to restart (remove the key, or use keep)")
			ok = false
		default:
			m.OnIgnoredCancel = v
		}
	}
	return m, ok
}

var overrideKeys = []string{"timeout", "idle_timeout", "enforcement", "approval", "approval_timeout"}

func (l *loader) decodeOverrides(e entry, path string) []rawOverride {
	es, ok := l.t.mapping(e.val, path, "a mapping of the server's tool names to budgets")
	if !ok {
		return nil
	}
	var out []rawOverride
	for _, oe := range es {
		opath := fmt.Sprintf("%s[%s]", path, oe.key)
		if strings.TrimSpace(oe.key) == "" {
			l.errAt(oe.keyAt, opath, "names no tool")
			continue
		}
		ofs, ok := l.t.mapping(oe.val, opath, "a mapping with timeout, idle_timeout, enforcement, approval or approval_timeout")
		if !ok {
			continue
		}
		fs := l.t.fields(ofs, opath, overrideKeys, approvalHint)
		ro := rawOverride{name: oe.key, path: opath}
		if te, ok := fs["timeout"]; ok {
			if v, at, ok := l.t.scalar(te.val, opath+".timeout", "a duration or a profile name"); ok {
				ro.timeout = &rawTimeout{v: v, at: at, path: opath + ".timeout"}
			}
		}
		if ie, ok := fs["idle_timeout"]; ok {
			ro.idle = l.idleTimeout(ie, opath+".idle_timeout")
		}
		if ee, ok := fs["enforcement"]; ok {
			ro.enf = l.enforcement(ee, opath+".enforcement")
		}
		ro.approval = l.decodeApproval(fs, opath)
		out = append(out, ro)
	}
	return out
}

func (l *loader) idleTimeout(e entry, path string) *rawDuration {
	v, at, ok := l.t.scalar(e.val, path, "a duration such as 15s")
	if !ok {
		return nil
	}
	d, problem := checkDuration(v, bounds{min: minDuration, max: maxDuration, zeroOK: true}, "15s")
	if problem != "" {
		l.errAt(at, path, problem)
		return nil
	}
	return &rawDuration{d: d, at: at}
}

var enforcementNames = []string{string(budget.Hard), string(budget.Cooperative), string(budget.Advisory)}

func (l *loader) enforcement(e entry, path string) budget.Enforcement {
	s, at, ok := l.t.str(e.val, path, "hard, cooperative or advisory")
	if !ok {
		return ""
	}
	if en := budget.Enforcement(s); en.Valid() {
		return en
	}
	hint := didYouMean(s, enforcementNames)
	if hint == "" {
		hint = " (use hard, cooperative or advisory)"
	}
	l.errAt(at, path, fmt.Sprintf("%q is not an enforcement mode%s", s, hint))
	return ""
}

// envList reads an allowlist of variable names. An empty list is kept
// empty (not nil): it means "inherit nothing", not "inherit everything".
func (l *loader) envList(e entry, path string) []string {
	items, _, ok := l.t.list(e.val, path, "")
	if !ok {
		return nil
	}
	out := make([]string, 0, len(items))
	for i, item := range items {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		s, at, ok := l.t.str(item, ipath, "a variable name")
		if !ok {
			continue
		}
		if !envNameRE.MatchString(s) {
			fix := "such as HOME"
			if name, _, found := strings.Cut(s, "="); found && envNameRE.MatchString(name) {
				fix = "such as " + name + "; the value comes from timebox's own environment"
			}
			l.errAt(at, ipath, fmt.Sprintf("%q is not a variable name (list names only, %s)", s, fix))
			continue
		}
		out = append(out, s)
	}
	return out
}

// schema converts an input_schema to JSON and compiles it, so that a bad
// schema is a configuration error now rather than a refused call later.
func (l *loader) schema(e entry, path string) json.RawMessage {
	r, ok := l.t.resolve(e.val, path)
	if !ok {
		return nil
	}
	if _, isMap := r.n.(*ast.MappingNode); !isMap {
		l.errAt(r.at, path, fmt.Sprintf("expected a JSON Schema object (a mapping such as {type: object, properties: {...}}), found %s", typeName(r.n)))
		return nil
	}
	left := maxJSONNodes
	v, ok := l.t.toJSON(e.val, path, 0, &left)
	if !ok {
		return nil
	}
	if m, _ := v.(map[string]any); m != nil {
		if t, has := m["type"]; has && tool.NotAnObject(t) != "" {
			l.errAt(r.at, path+".type", tool.NotAnObject(t))
			return nil
		}
	}
	raw, err := json.Marshal(v)
	if err != nil {
		l.errAt(r.at, path, "cannot be written as JSON: "+err.Error())
		return nil
	}
	if _, err := tool.CompileSchema(raw); err != nil {
		l.errAt(r.at, path, "is not a valid JSON Schema: "+strings.TrimPrefix(strings.TrimPrefix(err.Error(), "input_schema: "), "input_schema is not a JSON Schema: "))
		return nil
	}
	return raw
}

// resolveTools gives each tool its budget, now that tool, tool_max,
// kill_grace and the profiles are known.
func (l *loader) resolveTools() {
	for _, rt := range l.tools {
		// An entry with problems elsewhere still has its budgets checked,
		// so that every problem is reported in one pass; only a usable
		// entry becomes a tool.
		t := rt.t
		name := t.Name
		if name == "" {
			name = strings.TrimPrefix(rt.path, "tools")
		}
		knob := func(k string) string { return fmt.Sprintf("tools[%s].%s in %s", name, k, l.base) }

		t.Budget.Timeout = l.a.Budgets.Tool
		if rt.timeout != nil {
			d, ok := l.toolTimeout(rt.timeout, knob("timeout"))
			if ok {
				t.Budget.Timeout = d
			}
		}
		t.Budget.IdleTimeout = budget.Duration{Source: budget.SourceDefault, Knob: knob("idle_timeout")}
		if rt.idle != nil {
			t.Budget.IdleTimeout = budget.Duration{D: rt.idle.d, Source: budget.SourceTool, Knob: knob("idle_timeout")}
			l.checkIdle(rt.idle, rt.path+".idle_timeout", t.Budget.Timeout)
		}
		t.Budget.Enforcement = tool.DefaultEnforcement(t.Kind)
		if rt.enf != "" {
			t.Budget.Enforcement = rt.enf
		}
		t.Budget.KillGrace = l.a.Budgets.KillGrace
		if t.Kind == tool.KindExec && t.Workdir == "" {
			t.Workdir = l.dir
		}
		overrideKnob := func(o, k string) string {
			return fmt.Sprintf("tools[%s].overrides[%s].%s in %s", name, o, k, l.base)
		}
		overrides := map[string]Override{}
		if len(rt.overrides) > 0 {
			for _, ro := range rt.overrides {
				oknob := func(k string) string { return overrideKnob(ro.name, k) }
				var o Override
				if ro.timeout != nil {
					if d, ok := l.toolTimeout(ro.timeout, oknob("timeout")); ok {
						o.Timeout = d
					}
				}
				if ro.idle != nil {
					o.IdleTimeout = budget.Duration{D: ro.idle.d, Source: budget.SourceTool, Knob: oknob("idle_timeout")}
					timeout := t.Budget.Timeout
					if o.Timeout.Source != "" {
						timeout = o.Timeout
					}
					l.checkIdle(ro.idle, ro.path+".idle_timeout", timeout)
				}
				o.Enforcement = ro.enf
				overrides[ro.name] = o
			}
		}
		l.resolveApproval(rt, &t, knob, overrides, overrideKnob)
		if len(overrides) > 0 && t.MCP != nil {
			t.MCP.Overrides = overrides
		}
		if rt.ok {
			l.a.Tools = append(l.a.Tools, t)
		}
	}
}

// toolTimeout resolves a tool's own timeout: a profile name or a duration,
// no larger than tool_max.
func (l *loader) toolTimeout(rt *rawTimeout, knob string) (budget.Duration, bool) {
	s := strings.TrimSpace(rt.v.text)
	if offWords[strings.ToLower(s)] {
		l.errAt(rt.at, rt.path, fmt.Sprintf("%s is not a duration, and a tool's timeout cannot be off: every call needs a time limit (to never interrupt the tool, keep a timeout and set enforcement: advisory)", rt.v.show()))
		return budget.Duration{}, false
	}
	if !rt.v.number && profileNameRE.MatchString(s) {
		if d, ok := l.a.Profiles[s]; ok {
			if d > l.a.Budgets.ToolMax.D {
				l.errAt(rt.at, rt.path, fmt.Sprintf("profile %s is %s, which %s", s, fmtDuration(d), l.exceedsToolMax()))
				return budget.Duration{}, false
			}
			return budget.Duration{D: d, Source: budget.ProfileSource(s), Knob: knob}, true
		}
		if _, err := time.ParseDuration(s); err != nil {
			if _, guessable := durationFix(s); !guessable {
				names := make([]string, 0, len(l.a.Profiles))
				for n := range l.a.Profiles {
					names = append(names, n)
				}
				sort.Strings(names)
				fix := "use a duration such as 30s, or a profile: " + strings.Join(names, ", ")
				if c := suggest(s, names); c != "" {
					fix = "did you mean " + c + "? profiles: " + strings.Join(names, ", ")
				}
				l.errAt(rt.at, rt.path, fmt.Sprintf("%q is neither a duration nor a profile (%s)", s, fix))
				return budget.Duration{}, false
			}
		}
	}
	d, problem := parseDuration(rt.v)
	if problem == "" && d == 0 {
		problem = fmt.Sprintf("%s is not allowed: every tool call needs a time limit (to never interrupt the tool, keep a timeout and set enforcement: advisory)", rt.v.show())
	}
	if problem == "" {
		problem = durationRange(rt.v, d, durationBounds, "60s")
	}
	if problem == "" && d > l.a.Budgets.ToolMax.D {
		problem = fmt.Sprintf("%s %s", fmtDuration(d), l.exceedsToolMax())
	}
	if problem != "" {
		l.errAt(rt.at, rt.path, problem)
		return budget.Duration{}, false
	}
	return budget.Duration{D: d, Source: budget.SourceTool, Knob: knob}, true
}

// checkIdle warns about an idle timeout that can never fire because the
// call's whole timeout is not longer.
func (l *loader) checkIdle(idle *rawDuration, path string, timeout budget.Duration) {
	if idle.d > 0 && timeout.D > 0 && idle.d >= timeout.D {
		l.warnAt(idle.at, path, fmt.Sprintf("%s is not shorter than the call's timeout (%s, from %s), so it can never fire", fmtDuration(idle.d), fmtDuration(timeout.D), timeout.Knob))
	}
}

// shellPath is the path of abs as a command run where timebox was can use
// it: relative to the working directory when under it, else absolute. (A
// fix said with the path as the agent file writes it — relative to the
// file's own directory — failed when pasted elsewhere.)
func shellPath(abs string) string {
	wd, err := os.Getwd()
	if err != nil {
		return abs
	}
	rel, err := filepath.Rel(wd, abs)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return abs
	}
	return "./" + rel
}
