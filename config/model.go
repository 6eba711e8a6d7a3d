package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/goccy/go-yaml/ast"

	"github.com/timebox-run/timebox/internal/regular"
	"github.com/timebox-run/timebox/model/script"
)

// providerNames are the model providers of spec §11.
var providerNames = []string{"openai", "anthropic", "script"}

// defaultKeyEnv is the credential a provider gets when the file lists none.
var defaultKeyEnv = map[string]string{"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}

// exampleModel completes messages that show a provider:model.
var exampleModel = map[string]string{"openai": "gpt-4o-mini", "anthropic": "claude-haiku", "script": "demo"}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func (l *loader) decodeModel(e entry) {
	r, ok := l.t.resolve(e.val, "model")
	if _, isStr := r.n.(*ast.StringNode); !ok || isStr {
		l.modelAt = e.keyAt
		l.hasModel = true // the problem is reported; do not also call it missing
		if isStr {
			// model: openai:gpt-4o-mini, the model named where its
			// mapping goes.
			s := nodeText(r.n)
			l.errAt(r.at, "model", fmt.Sprintf("expected a mapping with primary and fallbacks, found the string %q (write model: {primary: %s}, or primary: %s on the next line, indented under model:)", s, s, s))
		}
		return
	}
	es, ok := l.t.mapping(e.val, "model", "a mapping with primary and fallbacks")
	l.modelAt = e.keyAt
	if !ok {
		l.hasModel = true // the problem is reported; do not also call it missing
		return
	}
	fs := l.t.fields(es, "model", []string{"primary", "fallbacks", "max_tokens"}, nil)
	if pe, ok := fs["primary"]; ok {
		l.hasModel = true
		s, at, ok := l.t.str(pe.val, "model.primary", "provider:model, such as openai:gpt-4o-mini")
		if ok {
			if ref, ok := l.modelRef(s, at, "model.primary"); ok {
				l.a.Model.Primary = ref
				l.chainAt = append(l.chainAt, at)
			}
		}
	}
	if me, ok := fs["max_tokens"]; ok {
		v, at, ok := l.t.scalar(me.val, "model.max_tokens", "a whole number of tokens")
		if ok {
			n, problem := checkCount(v, bounds{min: 1, max: MaxMaxTokens})
			if problem != "" {
				l.errAt(at, "model.max_tokens", problem)
			} else {
				l.a.Model.MaxTokens = n
			}
		}
	}
	if fe, ok := fs["fallbacks"]; ok {
		items, _, _ := l.t.list(fe.val, "model.fallbacks", "")
		for i, item := range items {
			path := fmt.Sprintf("model.fallbacks[%d]", i)
			s, at, ok := l.t.str(item, path, "provider:model")
			if !ok {
				continue
			}
			if ref, ok := l.modelRef(s, at, path); ok {
				l.a.Model.Fallbacks = append(l.a.Model.Fallbacks, ref)
				l.chainAt = append(l.chainAt, at)
			}
		}
	}
}

// modelRef parses "provider:model".
func (l *loader) modelRef(s string, at pos, path string) (ModelRef, bool) {
	prov, model, found := strings.Cut(strings.TrimSpace(s), ":")
	prov, model = strings.TrimSpace(prov), strings.TrimSpace(model)
	if !found {
		l.errAt(at, path, fmt.Sprintf("%q is not provider:model (such as %s)", s, guessRef(s)))
		return ModelRef{}, false
	}
	if !contains(providerNames, prov) {
		hint := didYouMean(prov, providerNames)
		if hint == "" {
			hint = " (use openai, anthropic or script)"
		}
		l.errAt(at, path, fmt.Sprintf("%q names an unknown provider %q%s", s, prov, hint))
		return ModelRef{}, false
	}
	if model == "" {
		l.errAt(at, path, fmt.Sprintf("%q names no model (such as %s:%s)", s, prov, exampleModel[prov]))
		return ModelRef{}, false
	}
	return ModelRef{Provider: prov, Model: model}, true
}

// guessRef turns a model name without a provider into the ref it most
// likely meant: "openai/gpt-4o" → "openai:gpt-4o", "claude-haiku" →
// "anthropic:claude-haiku", "gpt-4o" → "openai:gpt-4o".
func guessRef(s string) string {
	name := strings.TrimSpace(s)
	lower := strings.ToLower(name)
	for _, p := range providerNames {
		for _, sep := range []string{"/", "-", ".", " "} {
			if rest, ok := strings.CutPrefix(lower, p+sep); ok && rest != "" {
				return p + ":" + name[len(p)+len(sep):]
			}
		}
	}
	if name == "" {
		return "openai:" + exampleModel["openai"]
	}
	if strings.HasPrefix(lower, "claude") {
		return "anthropic:" + name
	}
	return "openai:" + name
}

func (l *loader) decodeProviders(e entry) {
	es, ok := l.t.mapping(e.val, "providers", "a mapping of provider names (openai, anthropic, script)")
	if !ok {
		return
	}
	fs := l.t.fields(es, "providers", providerNames, func(key string) string {
		if didYouMean(key, providerNames) != "" {
			return ""
		}
		return " (timebox has openai, anthropic and script; openai with base_url reaches any OpenAI-compatible endpoint)"
	})
	for _, name := range providerNames {
		pe, ok := fs[name]
		if !ok {
			continue
		}
		l.providerAt[name] = pe.keyAt
		path := "providers." + name
		if name == "script" {
			l.decodeScript(pe, path)
			continue
		}
		l.decodeAPIProvider(pe, path, name)
	}
}

func (l *loader) decodeAPIProvider(e entry, path, name string) {
	es, ok := l.t.mapping(e.val, path, "a mapping with base_url and credentials")
	if !ok {
		return
	}
	fs := l.t.fields(es, path, []string{"base_url", "credentials"}, keyHint)
	var p Provider
	if be, ok := fs["base_url"]; ok {
		s, at, ok := l.t.str(be.val, path+".base_url", "a URL")
		if ok {
			if u, err := url.Parse(s); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
				l.errAt(at, path+".base_url", fmt.Sprintf("%q is not an http(s) URL (such as https://api.%s.com/v1)", s, name))
			} else {
				p.BaseURL = s
			}
		}
	}
	if ce, ok := fs["credentials"]; ok {
		cpath := path + ".credentials"
		items, at, ok := l.t.list(ce.val, cpath, "")
		if ok && len(items) == 0 {
			l.errAt(at, cpath, fmt.Sprintf("lists no credential (list one, such as [{api_key_env: %s}], or remove the key to use %s)", defaultKeyEnv[name], defaultKeyEnv[name]))
		}
		for i, item := range items {
			ipath := fmt.Sprintf("%s[%d]", cpath, i)
			ies, ok := l.t.mapping(item, ipath, fmt.Sprintf("a mapping such as {api_key_env: %s}", defaultKeyEnv[name]))
			if !ok {
				continue
			}
			ifs := l.t.fields(ies, ipath, []string{"api_key_env"}, keyHint)
			ke, ok := ifs["api_key_env"]
			if !ok {
				if len(ies) == 0 {
					l.errAt(posOf(item), ipath+".api_key_env", "missing: name the variable that holds the key")
				}
				continue
			}
			s, at, ok := l.t.str(ke.val, ipath+".api_key_env", "a variable name")
			if !ok {
				continue
			}
			if !envNameRE.MatchString(s) {
				l.errAt(at, ipath+".api_key_env", fmt.Sprintf("%q is not a variable name (name the variable, such as %s; never the key itself)", s, defaultKeyEnv[name]))
				continue
			}
			p.Credentials = append(p.Credentials, Credential{APIKeyEnv: s})
		}
	}
	l.a.Providers[name] = p
}

// keyHint steers a person who writes an API key into the file towards a
// variable: keys in files end up in repositories.
func keyHint(key string) string {
	switch strings.ToLower(key) {
	case "api_key", "apikey", "key", "token", "secret":
		return " (never write a key in the file: put it in a variable and name the variable with credentials: [{api_key_env: NAME}])"
	case "api_key_env":
		return " (it goes inside credentials: [{api_key_env: NAME}])"
	}
	return ""
}

func (l *loader) decodeScript(e entry, path string) {
	es, ok := l.t.mapping(e.val, path, "a mapping with file")
	if !ok {
		l.a.Providers["script"] = Provider{File: "-"} // reported; not also "missing"
		return
	}
	fs := l.t.fields(es, path, []string{"file"}, nil)
	fe, ok := fs["file"]
	if !ok {
		return
	}
	s, at, ok := l.t.str(fe.val, path+".file", "the path of a JSONL script")
	if !ok {
		l.a.Providers["script"] = Provider{File: "-"}
		return
	}
	abs := l.abs(s)
	p := Provider{File: abs}
	if problem := fileProblem(s, abs); problem != "" {
		l.errAt(at, path+".file", problem)
	} else {
		p.Script = l.readScript(s, abs, at, path+".file")
	}
	l.a.Providers["script"] = p
}

// readScript parses the script file now, as the script model will play
// it, so that a bad line is a configuration error with its place in the
// script (file:line:col) rather than a failure when the agent is built.
func (l *loader) readScript(written, abs string, at pos, key string) []script.Line {
	name := written
	if !filepath.IsAbs(written) {
		name = filepath.Join(filepath.Dir(l.path), written) // as the person can open it
	}
	lines, err := script.ParseFile(abs, name)
	var problems script.ParseErrors
	switch {
	case errors.As(err, &problems):
		// Every problem of the script, each in its place in the script;
		// they are listed after the agent file's own.
		l.errs = append(l.errs, problems...)
		return nil
	case err != nil:
		l.errAt(at, key, fmt.Sprintf("%q cannot be read: %v", written, unwrapPath(err)))
		return nil
	case len(lines) == 0:
		l.errAt(at, key, fmt.Sprintf("%q has no lines (each line is a JSON reply, such as {\"text\": \"Hello\"})", written))
		return nil
	}
	if _, err := script.New(lines); err != nil {
		// What the script model itself refuses (only compaction lines).
		l.errAt(at, key, fmt.Sprintf("%q: %s", written, strings.TrimPrefix(err.Error(), "script: ")))
		return nil
	}
	return lines
}

// resolveProviders gives each provider the chain uses what it needs: the
// default credential for the API providers, a script file for the script
// provider.
func (l *loader) resolveProviders() {
	for i, ref := range l.a.Model.All() {
		if ref.Provider == "" {
			continue // the primary was missing or bad; reported
		}
		p := l.a.Providers[ref.Provider]
		switch ref.Provider {
		case "openai", "anthropic":
			if len(p.Credentials) == 0 {
				p.Credentials = []Credential{{APIKeyEnv: defaultKeyEnv[ref.Provider]}}
			}
		case "script":
			if p.File == "" {
				at, ok := l.providerAt["script"]
				if !ok && i < len(l.chainAt) {
					at = l.chainAt[i]
				}
				l.errAt(at, "providers.script.file", fmt.Sprintf(
					"missing: model %s uses the script provider, which plays a JSONL file of replies (add providers: {script: {file: script.jsonl}})", ref))
				p.File = "-" // once is enough
			}
		}
		l.a.Providers[ref.Provider] = p
	}
}

// abs makes a path from the file absolute against the file's directory.
func (l *loader) abs(p string) string {
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join(l.dir, p)
}

// fileProblem says why the file that written (as written) names and abs
// (made absolute) cannot be read or run, or "". It must be a regular file:
// reading a FIFO would block, and a device may never end.
func fileProblem(written, abs string) string {
	fi, err := os.Stat(abs)
	switch {
	case err != nil && os.IsNotExist(err):
		meant := ""
		if m := nearFile(written, abs); m != "" {
			meant = "did you mean " + m + "? "
		}
		return fmt.Sprintf("%q does not exist (%srelative paths are relative to the agent file's directory)", written, meant)
	case err != nil:
		return fmt.Sprintf("%q cannot be read: %v", written, unwrapPath(err))
	case fi.IsDir():
		return fmt.Sprintf("%q is a directory, not a file", written)
	case !fi.Mode().IsRegular():
		return fmt.Sprintf("%q is %s, not a regular file", written, regular.Describe(fi.Mode()))
	}
	return ""
}

// nearFile returns the file beside abs whose name is close to abs's (a
// typo: agnet.yaml, script.jsonl for scirpt.jsonl), written as written
// is, or "".
func nearFile(written, abs string) string {
	entries, err := os.ReadDir(filepath.Dir(abs))
	if err != nil || len(entries) > 10000 {
		return ""
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	m := suggest(filepath.Base(abs), names)
	if m == "" {
		return ""
	}
	return written[:len(written)-len(filepath.Base(written))] + m
}

func unwrapPath(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}
