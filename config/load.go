package config

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/goccy/go-yaml/ast"

	"github.com/timebox-run/timebox/budget"
	"github.com/timebox-run/timebox/internal/regular"
)

// Overrides are the values that beat the agent file (spec §2): flags, then
// TIMEBOX_* variables.
type Overrides struct {
	// Flags maps a setting's Key ("timeouts.tool") to the value as the user
	// typed it ("2m"). Only flags the user actually set belong here: an
	// entry, even an empty one, overrides the file.
	Flags map[string]string
	// Env is the environment in os.Environ form ("KEY=value"); a variable
	// listed twice takes its last value, as exec.Cmd does. Nil means no
	// environment, which keeps tests and library callers hermetic: Load
	// never reads the process environment itself.
	Env []string
}

// Load reads the agent file at path (spec §15), checks it fully and
// resolves every budget with its source and knob.
//
// The file must be a regular file (a FIFO or a device is an error, and
// never blocks) of at most MaxFileBytes; it is refused before it is
// parsed when it passes the other bounds of bounds.go (words, tokens,
// nesting, keys of a mapping), and before any alias is expanded when its
// aliases stand for more than MaxAliasValues values.
//
// On any problem it returns a nil *Agent and an Errors holding every
// problem found in the file, the flags and the environment, each with its
// position and a fix. Unknown TIMEBOX_* variables and other doubtful but
// harmless settings are not errors; they are in Agent.Warnings.
//
// Load reads files relative to the agent file (the script provider's file,
// exec programs with a slash, workdirs) to check that they exist; it runs
// nothing and connects to nothing. Credentials are not read: a missing key
// is the model's problem when it is built, so that failover can move past
// it.
func Load(path string, o Overrides) (*Agent, error) {
	l := newLoader(path, o)
	data, err := regular.ReadFile(path, MaxFileBytes)
	if err != nil {
		l.errs = append(l.errs, &Error{File: path, Msg: readProblem(path, err)})
		l.readOverrides()
		l.sortErrs()
		return nil, l.errs
	}
	return l.load(data)
}

func readProblem(path string, err error) string {
	if errors.Is(err, fs.ErrNotExist) {
		if abs, aerr := filepath.Abs(path); aerr == nil {
			if m := nearFile(path, abs); m != "" {
				return "the agent file does not exist (did you mean " + m + "?)"
			}
		}
		return "the agent file does not exist"
	}
	var nr *regular.NotRegularError
	if errors.As(err, &nr) {
		return fmt.Sprintf("the agent file is %s, not a regular file (give the path of a YAML file)", regular.Describe(nr.Mode))
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return "cannot read the agent file: " + pe.Err.Error()
	}
	return "cannot read the agent file: " + err.Error()
}

// loader holds the state of one Load: what the file said, what the
// overrides said, and every problem so far.
type loader struct {
	path string // as given, for messages
	base string // the file's base name, for knobs ("... in agent.yaml")
	dir  string // absolute directory of the file
	o    Overrides

	errs Errors
	// warns are the file's warnings, envWarns the environment's; the
	// file's come first, as its errors do.
	warns, envWarns []string
	t               *tree
	a               *Agent

	// Values of process-wide settings by Key, by where they came from.
	file map[string]fileValue
	env  map[string]int64
	flag map[string]int64

	profiles map[string]time.Duration // the file's own profiles
	tools    []*rawTool

	hasModel   bool
	modelAt    pos
	chainAt    []pos          // position of each model of the chain
	providerAt map[string]pos // position of each providers.NAME key
	// toolNamePos is where each entry's name is, by entry path.
	toolNamePos map[string]pos
	compactAt   budget.Count
	timeNotes   budget.Count // 1 on, 0 off
}

// fileValue is a setting's value in the file and where it is.
type fileValue struct {
	n  int64
	at pos
}

func newLoader(path string, o Overrides) *loader {
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		dir = filepath.Dir(path)
	}
	a := &Agent{
		Path:      path,
		Dir:       dir,
		Model:     Chain{MaxTokens: DefaultMaxTokens},
		Providers: map[string]Provider{},
		Budgets:   budget.Defaults(),
		Limits:    budget.DefaultLimits(),
		Profiles:  budget.DefaultProfiles(),
		Server: Server{ShutdownGrace: budget.Duration{
			D: 10 * time.Second, Source: budget.SourceDefault, Knob: KeyShutdownGrace}},
	}
	return &loader{
		path: path, base: filepath.Base(path), dir: dir, o: o, a: a,
		file: map[string]fileValue{}, env: map[string]int64{}, flag: map[string]int64{},
		profiles: map[string]time.Duration{}, providerAt: map[string]pos{}, toolNamePos: map[string]pos{},
		compactAt: budget.Count{N: 100000, Source: budget.SourceDefault, Knob: KeyCompactAt},
		timeNotes: budget.Count{N: 1, Source: budget.SourceDefault, Knob: KeyTimeNotes},
	}
}

// errAt records a problem at a position of the file. A problem of the
// whole file (a key missing from it) is placed at its start, 1:1, so that
// every problem of the file has the file:line:col of spec §10.
func (l *loader) errAt(p pos, key, msg string) {
	if p.line < 1 || p.col < 1 {
		p = pos{1, 1}
	}
	l.errs = append(l.errs, &Error{File: l.path, Line: p.line, Col: p.col, Key: key, Msg: msg})
}

// warnAt records a doubtful setting at a position of the file, worded like
// an error so that a person finds it the same way.
func (l *loader) warnAt(p pos, key, msg string) {
	e := &Error{File: l.path, Line: p.line, Col: p.col, Key: key, Msg: msg}
	l.warns = append(l.warns, e.Error())
}

func (l *loader) load(data []byte) (*Agent, error) {
	data = regular.TrimBOM(data)
	// CRLF line endings (a file saved on Windows) are LF ones to YAML; the
	// YAML reader counts a comment's CRLF as two lines, and every problem
	// after it was placed lines too far.
	data = bytes.ReplaceAll(data, []byte("\r\n"), []byte("\n"))
	if off, problem := regular.NotUTF8(data); off >= 0 {
		// The YAML reader would read each bad byte as U+FFFD, without a
		// word: a model's name, a key, an argument changed unseen.
		line := 1 + bytes.Count(data[:off], []byte("\n"))
		col := 1 + utf8.RuneCount(data[bytes.LastIndexByte(data[:off], '\n')+1:off])
		l.errAt(pos{line, col}, "", "the file is not UTF-8 text: "+problem)
		l.readOverrides()
		l.sortErrs()
		return nil, l.errs
	}
	if len(data) > MaxFileBytes {
		p, msg := fileTooLarge(data)
		l.errAt(p, "", msg)
		l.readOverrides()
		l.sortErrs()
		return nil, l.errs
	}
	f, p, key, msg := parseYAML(data)
	if msg != "" {
		l.errAt(p, key, msg)
		l.readOverrides()
		l.sortErrs()
		return nil, l.errs
	}
	var root ast.Node
	if f != nil {
		docs := 0
		for _, d := range f.Docs {
			if d == nil || d.Body == nil {
				continue
			}
			docs++
			if docs == 1 {
				root = d.Body
				continue
			}
			l.errAt(posOf(d.Body), "", "the file holds a second YAML document; an agent file is one document (remove the ---)")
			break
		}
	}
	l.t = &tree{l: l, anchors: map[string][]anchorDef{}}
	collectAnchors(root, l.t.anchors, 0)
	l.decodeTop(root)
	l.readOverrides()
	l.resolveSettings()
	l.resolveTools()
	l.resolveProviders()

	if len(l.errs) > 0 {
		l.sortErrs()
		return nil, l.errs
	}
	l.a.Warnings = append(l.warns, l.envWarns...)
	return l.a, nil
}

var topKeys = []string{"name", "instructions", "model", "providers", "timeouts", "limits", "context", "server", "tools"}

// movedKeys gives, for a key written in the wrong section, where it
// belongs: "max_steps" → "limits.max_steps".
var movedKeys = func() map[string]string {
	m := map[string]string{"profiles": "timeouts.profiles", "primary": "model.primary", "fallbacks": "model.fallbacks"}
	for _, s := range Settings {
		_, leaf, _ := strings.Cut(s.Key, ".")
		m[leaf] = s.Key
	}
	return m
}()

// movedHint suggests the right section for a key that exists elsewhere.
func movedHint(section string) func(string) string {
	return func(key string) string {
		if full, ok := movedKeys[key]; ok && !strings.HasPrefix(full, section+".") {
			return fmt.Sprintf(" (did you mean %s? it belongs under %s:)", full, strings.SplitN(full, ".", 2)[0])
		}
		return ""
	}
}

// unindentedHint explains a top-level key that belongs to a section
// written empty above it ("timeouts:" then "tool: 5s" at column 0): the
// person meant to indent it. That beats any did-you-mean of a top-level
// key ("tools" for "tool"), since the empty section shows the intent.
func unindentedHint(es []entry, key string) string {
	var sections []string // where key may belong
	if full, ok := movedKeys[key]; ok {
		sections = append(sections, strings.SplitN(full, ".", 2)[0])
	}
	if contains(providerNames, key) {
		sections = append(sections, "providers")
	}
	if contains(toolKeys, key) {
		sections = append(sections, "tools")
	}
	if len(sections) == 0 {
		return ""
	}
	var own *entry
	for i := range es {
		if es[i].key == key {
			own = &es[i]
			break
		}
	}
	if own == nil {
		return ""
	}
	// The section must be the known key nearest above: indenting the
	// key puts it under that one, whatever the person meant. A tool's
	// name, unindented, is the agent's name: it does not count.
	var sec *entry
	for i := range es {
		e := &es[i]
		if contains(topKeys, e.key) && e.keyAt.line < own.keyAt.line && (sec == nil || e.keyAt.line > sec.keyAt.line) &&
			!(e.key == "name" && contains(sections, "tools")) {
			sec = e
		}
	}
	if sec == nil || !contains(sections, sec.key) {
		return ""
	}
	section := sec.key
	switch sec.val.(type) {
	case nil, *ast.NullNode:
	default:
		return ""
	}
	if section == "tools" {
		return fmt.Sprintf(" (a key of a tool; tools: on line %d is empty: write each tool as an item of its list, \"  - name: …\" under \"tools:\", with its other keys under the name, indented 4 spaces)", sec.keyAt.line)
	}
	fix := "indent it (and any lines under it) by 2 spaces"
	switch v := own.val.(type) {
	case *ast.StringNode, *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode:
		fix = fmt.Sprintf("indent it by 2 spaces: %q under %q", "  "+key+": "+v.GetToken().Value, section+":")
	}
	return fmt.Sprintf(" (it belongs under %s: on line %d, which is empty; %s)", section, sec.keyAt.line, fix)
}

// fitsMoved reports whether the value of the top-level key has the shape
// of the setting movedKeys names for it: a mapping for profiles, a scalar
// for the others (a list too for fallbacks).
func fitsMoved(es []entry, key string) bool {
	for _, e := range es {
		if e.key != key {
			continue
		}
		switch e.val.(type) {
		case *ast.MappingNode:
			return key == "profiles"
		case *ast.SequenceNode:
			return key == "fallbacks"
		}
		return key != "profiles"
	}
	return false
}

func (l *loader) decodeTop(root ast.Node) {
	es, ok := l.t.mapping(root, "", "a mapping of keys (model, tools, timeouts, …)")
	if !ok {
		return
	}
	fs := l.t.fields(es, "", topKeys, func(key string) string {
		if h := unindentedHint(es, key); h != "" {
			return h
		}
		full, moved := movedKeys[key]
		typo := suggest(key, topKeys)
		switch {
		case moved && typo != "" && !fitsMoved(es, key):
			return "" // "tool: {name: b}" is a typo of tools, not timeouts.tool
		case moved && typo != "":
			// Both are likely: "tool: 5s" a typo of tools, or
			// timeouts.tool written at the top level; "profiles" of
			// providers, or timeouts.profiles.
			return fmt.Sprintf(" (did you mean %s? or %s, which belongs under %s:)", typo, full, strings.SplitN(full, ".", 2)[0])
		case moved:
			return fmt.Sprintf(" (did you mean %s? it belongs under %s:)", full, strings.SplitN(full, ".", 2)[0])
		}
		return "" // fields' did-you-mean of a top-level key, if any
	})
	if e, ok := fs["name"]; ok {
		l.a.Name, _, _ = l.t.str(e.val, "name", "a name")
	}
	if e, ok := fs["instructions"]; ok {
		l.a.Instructions, _, _ = l.t.str(e.val, "instructions", "the system instructions")
	}
	if e, ok := fs["model"]; ok {
		l.decodeModel(e)
	}
	if e, ok := fs["providers"]; ok {
		l.decodeProviders(e)
	}
	for _, section := range []string{"timeouts", "limits", "context", "server"} {
		if e, ok := fs[section]; ok {
			l.decodeSection(e, section)
		}
	}
	if e, ok := fs["tools"]; ok {
		l.decodeTools(e)
	}
	// An unindented primary: under an empty model: is reported as that,
	// with its fix; "missing" would say the same mistake twice.
	if !l.hasModel && unindentedHint(es, "primary") == "" {
		at := pos{}
		if e, ok := fs["model"]; ok {
			at = e.keyAt
		}
		l.errAt(at, "model.primary", "missing: every agent needs a model (add model: {primary: openai:gpt-4o-mini})")
	}
}

// decodeSection reads one of the sections of process-wide settings.
func (l *loader) decodeSection(e entry, section string) {
	var known []string
	for _, s := range Settings {
		if strings.HasPrefix(s.Key, section+".") {
			known = append(known, strings.TrimPrefix(s.Key, section+"."))
		}
	}
	switch section {
	case "timeouts":
		known = append(known, "profiles")
	case "server":
		known = append(known, "request_max", "webhooks")
	}
	es, ok := l.t.mapping(e.val, section, "a mapping of "+section)
	if !ok {
		return
	}
	fs := l.t.fields(es, section, known, movedHint(section))
	for _, k := range known {
		fe, ok := fs[k]
		if !ok {
			continue
		}
		switch k {
		case "profiles":
			l.decodeProfiles(fe)
			continue
		case "request_max":
			l.decodeRequestMax(fe)
			continue
		case "webhooks":
			l.decodeWebhooks(fe)
			continue
		}
		s, _ := SettingByKey(section + "." + k)
		v, at, ok := l.t.scalar(fe.val, s.Key, kindWhat(s.Kind))
		if !ok {
			continue
		}
		n, problem := s.parse(v)
		if problem != "" {
			l.errAt(at, s.Key, problem)
			continue
		}
		l.file[s.Key] = fileValue{n: n, at: at}
	}
}

func kindWhat(k SettingKind) string {
	switch k {
	case KindDuration:
		return "a duration such as 30s"
	case KindBytes:
		return "a size such as 1MiB"
	case KindSwitch:
		return "on or off"
	}
	return "a whole number"
}

// decodeRequestMax reads server.request_max: the ceiling up to which one
// request's budgets may raise each budget a request may set.
func (l *loader) decodeRequestMax(e entry) {
	const path = "server.request_max"
	es, ok := l.t.mapping(e.val, path, "a mapping of budget names to ceilings")
	if !ok {
		return
	}
	names := budget.RequestNames()
	fs := l.t.fields(es, path, names, func(string) string { return "" })
	for _, name := range names {
		fe, ok := fs[name]
		if !ok {
			continue
		}
		kn, _ := budget.KnobByName(name)
		key := path + "." + name
		b := bounds{min: kn.Min, max: kn.Max}
		var n int64
		var problem string
		if kn.Kind == budget.KindDuration {
			v, at, ok := l.t.scalar(fe.val, key, "a duration such as 2h")
			if !ok {
				continue
			}
			var d time.Duration
			d, problem = checkDuration(v, b, "2h")
			n = int64(d)
			if problem != "" {
				l.errAt(at, key, problem)
				continue
			}
		} else {
			v, at, ok := l.t.scalar(fe.val, key, "a whole number")
			if !ok {
				continue
			}
			n, problem = checkCount(v, b)
			if problem != "" {
				l.errAt(at, key, problem)
				continue
			}
		}
		if l.a.Server.RequestMax == nil {
			l.a.Server.RequestMax = map[string]int64{}
		}
		l.a.Server.RequestMax[name] = n
	}
}

func (l *loader) decodeProfiles(e entry) {
	const path = "timeouts.profiles"
	es, ok := l.t.mapping(e.val, path, "a mapping of profile names to durations")
	if !ok {
		return
	}
	for _, pe := range es {
		key := path + "." + pe.key
		if !profileNameRE.MatchString(pe.key) {
			l.errAt(pe.keyAt, key, fmt.Sprintf("%q is not a profile name (start with a letter; use letters, digits, _ and -)", pe.key))
			continue
		}
		v, at, ok := l.t.scalar(pe.val, key, "a duration such as 5m")
		if !ok {
			continue
		}
		d, problem := parseDuration(v)
		if problem == "" && d == 0 {
			problem = fmt.Sprintf("%s is not allowed: a profile is a tool's timeout, which cannot be off (use a duration such as 5m)", v.show())
		}
		if problem == "" {
			problem = durationRange(v, d, durationBounds, "5m")
		}
		if problem != "" {
			l.errAt(at, key, problem)
			continue
		}
		l.profiles[pe.key] = d
	}
}

// readOverrides reads the TIMEBOX_* variables and the flags. Their
// problems name the variable or flag, which is what the person changes.
func (l *loader) readOverrides() {
	vars := map[string]string{}
	for _, kv := range l.o.Env {
		k, v, ok := strings.Cut(kv, "=")
		if ok && strings.HasPrefix(k, "TIMEBOX_") {
			vars[k] = v // the last one wins, as in exec.Cmd
		}
	}
	names := make([]string, 0, len(vars))
	for k := range vars {
		names = append(names, k)
	}
	sort.Strings(names)
	known := envNames()
	for _, k := range names {
		v := vars[k]
		s, ok := settingByEnv(k)
		if !ok {
			if !contains(otherEnv, k) {
				l.envWarns = append(l.envWarns, fmt.Sprintf("%s is not a timebox variable; it is ignored%s", k, didYouMean(k, known)))
			}
			continue
		}
		if strings.TrimSpace(v) == "" {
			// An empty variable is how shells unset one for a single
			// command (TIMEBOX_TURN_TIMEOUT= timebox run); say so rather
			// than fail, and rather than ignore it silently.
			l.envWarns = append(l.envWarns, fmt.Sprintf("%s is set but empty; it is ignored", k))
			continue
		}
		n, problem := s.parse(value{text: v})
		if problem != "" {
			l.errs = append(l.errs, &Error{Key: k, Msg: problem})
			continue
		}
		l.env[s.Key] = n
	}

	keys := make([]string, 0, len(l.o.Flags))
	for k := range l.o.Flags {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var settingKeys []string
	for _, s := range Settings {
		settingKeys = append(settingKeys, s.Key)
	}
	for _, k := range keys {
		s, ok := SettingByKey(k)
		if !ok {
			l.errs = append(l.errs, &Error{Key: "--" + k, Msg: "is not a setting" + didYouMean(k, settingKeys)})
			continue
		}
		n, problem := s.parse(value{text: l.o.Flags[k]})
		if problem != "" {
			l.errs = append(l.errs, &Error{Key: "--" + s.Flag, Msg: problem})
			continue
		}
		l.flag[s.Key] = n
	}
}

func settingByEnv(name string) (Setting, bool) {
	for _, s := range Settings {
		if s.Env == name {
			return s, true
		}
	}
	return Setting{}, false
}

// resolveSettings gives each process-wide setting its value: flag >
// environment > file > default.
func (l *loader) resolveSettings() {
	for _, s := range Settings {
		src, knob, n, set := budget.Source(""), "", int64(0), false
		if fv, ok := l.file[s.Key]; ok {
			src, knob, n, set = budget.SourceFile, s.Key, fv.n, true
		}
		if v, ok := l.env[s.Key]; ok {
			src, knob, n, set = budget.SourceEnv, s.Env, v, true
		}
		if v, ok := l.flag[s.Key]; ok {
			src, knob, n, set = budget.SourceFlag, "--"+s.Flag, v, true
		}
		if !set {
			continue // the default is already in place
		}
		d, c := l.slot(s.Key)
		if d != nil {
			*d = budget.Duration{D: time.Duration(n), Source: src, Knob: knob}
		} else {
			*c = budget.Count{N: n, Source: src, Knob: knob}
		}
	}
	l.a.Context.CompactAt = int(l.compactAt.N)
	l.a.Context.Source = l.compactAt.Source
	l.a.Context.Knob = l.compactAt.Knob
	l.a.Context.TimeNotes = l.timeNotes.N != 0
	l.a.Context.TimeNotesSource = l.timeNotes.Source
	l.a.Context.TimeNotesKnob = l.timeNotes.Knob

	b := l.a.Budgets
	if b.Tool.D > b.ToolMax.D {
		// Blame the one that was set on purpose; when both were, the
		// tool timeout, as the spec's message does.
		if b.Tool.Source == budget.SourceDefault {
			l.errSetting(budget.KeyToolMax, b.ToolMax.Source, fmt.Sprintf(
				"%s is below %s (%s, the default); raise it or lower %s",
				fmtDuration(b.ToolMax.D), budget.KeyTool, fmtDuration(b.Tool.D), budget.KeyTool))
		} else {
			l.errSetting(budget.KeyTool, b.Tool.Source, fmt.Sprintf("%s %s",
				fmtDuration(b.Tool.D), l.exceedsToolMax()))
		}
	}
	for name, d := range l.profiles {
		l.a.Profiles[name] = d
	}
}

// exceedsToolMax ends a message about a tool timeout above tool_max.
func (l *loader) exceedsToolMax() string {
	m := l.a.Budgets.ToolMax
	raise := "tool_max"
	if m.Knob != budget.KeyToolMax {
		raise = m.Knob
	}
	return fmt.Sprintf("exceeds %s (%s); lower it or raise %s", m.Knob, fmtDuration(m.D), raise)
}

// errSetting reports a problem with a resolved setting where it was set.
func (l *loader) errSetting(key string, src budget.Source, msg string) {
	s, _ := SettingByKey(key)
	switch src {
	case budget.SourceFlag:
		l.errs = append(l.errs, &Error{Key: "--" + s.Flag, Msg: msg})
	case budget.SourceEnv:
		l.errs = append(l.errs, &Error{Key: s.Env, Msg: msg})
	default:
		l.errAt(l.file[key].at, key, msg)
	}
}

// slot returns where a setting's resolved value goes: a budget's place in
// Budgets or Limits (budget.Knobs), or one of the two settings that are not
// a turn's budgets.
func (l *loader) slot(key string) (*budget.Duration, *budget.Count) {
	if k, ok := budget.KnobByKey(key); ok {
		return k.Duration(&l.a.Budgets), k.Count(&l.a.Limits)
	}
	switch key {
	case KeyShutdownGrace:
		return &l.a.Server.ShutdownGrace, nil
	case KeyCompactAt:
		return nil, &l.compactAt
	case KeyTimeNotes:
		return nil, &l.timeNotes
	}
	panic("config: no slot for setting " + key)
}
