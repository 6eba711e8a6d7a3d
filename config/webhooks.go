package config

import (
	"encoding/base64"
	"fmt"
	"net/url"
	"slices"
	"strings"

	"github.com/goccy/go-yaml/ast"
)

// Webhook is one entry of server.webhooks: a receiver that `timebox serve`
// POSTs the events it subscribes to, signed the Standard Webhooks way
// (docs/webhooks.md).
type Webhook struct {
	// URL is the receiver, an http or https URL.
	URL string
	// Events are the event types sent, each with its filter.
	Events []WebhookEvent
	// SecretEnv names the variable that holds the signing secret, a
	// whsec_ secret (WebhookSecret). The secret itself is never in the file.
	SecretEnv string
	// at is where the file names SecretEnv, for the problems of
	// WebhookSecrets; zero for a Webhook made in code.
	at pos
}

// WebhookEvent is one event type a webhook subscribes to.
type WebhookEvent struct {
	// Type is the event type sent: turn_finished, tool_finished, …
	Type string
	// Outcomes, for tool_finished, keeps only the calls that ended so
	// ("timed_out", "error"); empty sends every outcome.
	Outcomes []string
}

// Wants reports whether w subscribes to an event of type typ whose call
// outcome (tool_finished; empty for other types) is outcome.
func (w Webhook) Wants(typ, outcome string) bool {
	for _, e := range w.Events {
		if e.Type == typ && (len(e.Outcomes) == 0 || slices.Contains(e.Outcomes, outcome)) {
			return true
		}
	}
	return false
}

// WebhookEventTypes are the event types a webhook may subscribe to: every
// event of spec §7 but those that stream a turn's text and progress
// (llm_delta, tool_progress), which would be one POST per token.
// approval_requested and approval_decided are the approvals' events.
var WebhookEventTypes = []string{
	"turn_started", "turn_finished", "still_working", "failover",
	"tool_started", "tool_finished", "approval_requested", "approval_decided",
	"llm_finished", "compaction_started", "compaction_finished",
}

// WebhookOutcomes are the outcomes a tool_finished filter may name.
var WebhookOutcomes = []string{"ok", "error", "timed_out", "cancelled", "abandoned", "interrupted", "approval_expired", "denied"}

// SecretPrefix begins every webhook secret: the rest is the key, in
// base64 (Standard Webhooks).
const SecretPrefix = "whsec_"

// WebhookSecret decodes a whsec_ secret into the HMAC key it holds. The
// error is a sentence fragment with its fix, which never repeats the value.
func WebhookSecret(v string) ([]byte, error) {
	const fix = "such as whsec_ followed by the base64 of 24 to 64 random bytes: `echo whsec_$(openssl rand -base64 32)`"
	rest, ok := strings.CutPrefix(strings.TrimSpace(v), SecretPrefix)
	if !ok {
		return nil, fmt.Errorf("is not a whsec_ secret (give one %s)", fix)
	}
	key, err := base64.StdEncoding.DecodeString(rest)
	raw, rawErr := base64.RawStdEncoding.DecodeString(rest)
	if err != nil && rawErr == nil && (len(raw) < 24 || len(raw) > 64) {
		key, err = raw, nil // its size is the problem to name, not only its padding
	}
	if err != nil && rawErr == nil {
		// Receivers decode the secret as Standard Webhooks' libraries
		// do, padded: they could not check what timebox signed.
		return nil, fmt.Errorf("holds a whsec_ secret whose base64 lacks its padding (end it with = as openssl writes it, so that receivers can decode it)")
	}
	if err != nil {
		return nil, fmt.Errorf("holds a whsec_ secret whose key is not base64 (give one %s)", fix)
	}
	if len(key) < 24 || len(key) > 64 {
		return nil, fmt.Errorf("holds a whsec_ secret of %d bytes; Standard Webhooks keys are 24 to 64 (give one %s)", len(key), fix)
	}
	return key, nil
}

// WebhookSecrets reads the signing key of each webhook from getenv, in
// a's order. Its error names every variable that is unset or holds no
// whsec_ secret: `timebox serve` does not start without them.
func (a *Agent) WebhookSecrets(getenv func(string) string) ([][]byte, error) {
	var keys [][]byte
	var problems Errors
	for i, w := range a.Server.Webhooks {
		p := &Error{Key: fmt.Sprintf("server.webhooks[%d].secret_env", i)}
		if w.at.line > 0 {
			// Placed where the file names the variable, as every other
			// problem of the file is.
			p.File, p.Line, p.Col = a.Path, w.at.line, w.at.col
		}
		v := getenv(w.SecretEnv)
		if v == "" {
			p.Msg = fmt.Sprintf("%s is not set (set it to the receiver's whsec_ secret)", w.SecretEnv)
			problems = append(problems, p)
			continue
		}
		k, err := WebhookSecret(v)
		if err != nil {
			p.Msg = fmt.Sprintf("%s %v", w.SecretEnv, err)
			problems = append(problems, p)
			continue
		}
		keys = append(keys, k)
	}
	if len(problems) > 0 {
		return nil, problems
	}
	return keys, nil
}

var webhookKeys = []string{"url", "events", "secret_env"}

// decodeWebhooks reads server.webhooks. The secret is read when the
// environment given to Load holds its variable (and refused if it is no
// whsec_ secret); an unset one is for `timebox validate` and `serve` to
// report (Agent.WebhookSecrets), as a provider's credential is.
func (l *loader) decodeWebhooks(e entry) {
	const path = "server.webhooks"
	items, _, ok := l.t.list(e.val, path, "")
	if !ok {
		return
	}
	env := map[string]string{}
	for _, kv := range l.o.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	for i, item := range items {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		es, ok := l.t.mapping(item, ipath, "a webhook (a mapping with url, events and secret_env)")
		if !ok {
			continue
		}
		fs := l.t.fields(es, ipath, webhookKeys, func(key string) string {
			switch strings.ToLower(key) {
			case "secret", "token", "key", "signing_secret":
				return " (never write a secret in the file: put it in a variable and name the variable with secret_env: NAME)"
			}
			return ""
		})
		var w Webhook
		good := true
		missing := func(k, what string) {
			l.errAt(posOf(item), ipath+"."+k, "missing: "+what)
			good = false
		}
		if ue, ok := fs["url"]; ok {
			s, at, ok := l.t.str(ue.val, ipath+".url", "a URL")
			if ok {
				if problem := webhookURLProblem(s); problem != "" {
					l.errAt(at, ipath+".url", problem)
					good = false
				}
				w.URL = s
			} else {
				good = false
			}
		} else {
			missing("url", "give the receiver's URL (such as url: https://hooks.example.com/timebox)")
		}
		if ee, ok := fs["events"]; ok {
			w.Events, ok = l.webhookEvents(ee, ipath+".events")
			good = good && ok
		} else {
			missing("events", "list the event types to send (such as events: [turn_finished, failover])")
		}
		if se, ok := fs["secret_env"]; ok {
			s, at, ok := l.t.str(se.val, ipath+".secret_env", "a variable name")
			switch {
			case !ok:
				good = false
			case !envNameRE.MatchString(s):
				l.errAt(at, ipath+".secret_env", fmt.Sprintf("%q is not a variable name (name the variable that holds the whsec_ secret, such as TIMEBOX_WEBHOOK_SECRET; never the secret itself)", short(s)))
				good = false
			default:
				w.SecretEnv, w.at = s, at
				if v, set := env[s]; set {
					if _, err := WebhookSecret(v); err != nil {
						l.errAt(at, ipath+".secret_env", fmt.Sprintf("%s %v", s, err))
						good = false
					}
				}
			}
		} else {
			missing("secret_env", "name the variable that holds the receiver's whsec_ secret (such as secret_env: TIMEBOX_WEBHOOK_SECRET)")
		}
		if good {
			l.a.Server.Webhooks = append(l.a.Server.Webhooks, w)
		}
	}
}

// short keeps a value in a message short, and never whole when it could
// be a secret written where its variable's name goes.
func short(s string) string {
	if len(s) > 12 {
		return s[:6] + "…"
	}
	return s
}

// webhookURLProblem returns why s cannot be a webhook's receiver, "" when
// it can. Whether it points at timebox itself is known only once the
// server's address is (server.CheckWebhooks).
func webhookURLProblem(s string) string {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		return fmt.Sprintf("%q is not a URL (give an http(s) URL such as https://hooks.example.com/timebox)", s)
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Sprintf("%q is not an http(s) URL: a webhook is an HTTP POST (give an http(s) URL such as https://hooks.example.com/timebox)", s)
	case u.Host == "" || u.Hostname() == "":
		return fmt.Sprintf("%q has no host (give an http(s) URL such as https://hooks.example.com/timebox)", s)
	case u.User != nil:
		return fmt.Sprintf("%q holds credentials; the file is no place for them (the signature authenticates timebox: the receiver checks it with the secret)", u.Redacted())
	}
	return ""
}

// webhookEvents reads a webhook's events: each an event type, or a mapping
// {type: tool_finished, outcomes: [timed_out, error]}.
func (l *loader) webhookEvents(e entry, path string) ([]WebhookEvent, bool) {
	items, at, ok := l.t.list(e.val, path, "")
	if !ok {
		return nil, false
	}
	if len(items) == 0 {
		l.errAt(at, path, "lists no event (list the types to send, such as [turn_finished, failover])")
		return nil, false
	}
	good := true
	var out []WebhookEvent
	checkType := func(s string, at pos, p string) bool {
		if !slices.Contains(WebhookEventTypes, s) {
			hint := ""
			if g := suggest(s, WebhookEventTypes); g != "" {
				hint = fmt.Sprintf("did you mean %s? ", g)
			}
			l.errAt(at, p, fmt.Sprintf("%q is not an event type a webhook can send (%suse one of %s)", s, hint, strings.Join(WebhookEventTypes, ", ")))
			return false
		}
		return true
	}
	for i, item := range items {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		if _, isMap := mappingNode(l.t, item, ipath); isMap {
			es, ok := l.t.mapping(item, ipath, "an event type or {type, outcomes}")
			if !ok {
				good = false
				continue
			}
			fs := l.t.fields(es, ipath, []string{"type", "outcomes"}, func(string) string { return "" })
			var we WebhookEvent
			te, ok := fs["type"]
			if !ok {
				l.errAt(posOf(item), ipath+".type", "missing: name the event type (such as type: tool_finished)")
				good = false
				continue
			}
			s, tat, ok := l.t.str(te.val, ipath+".type", "an event type")
			if !ok || !checkType(s, tat, ipath+".type") {
				good = false
				continue
			}
			we.Type = s
			if oe, ok := fs["outcomes"]; ok {
				if s != "tool_finished" {
					l.errAt(oe.keyAt, ipath+".outcomes", "applies to tool_finished only (other events have no outcome)")
					good = false
					continue
				}
				ois, oat, ok := l.t.list(oe.val, ipath+".outcomes", "")
				if ok && len(ois) == 0 {
					l.errAt(oat, ipath+".outcomes", "lists no outcome (list some, such as [timed_out, error], or remove the key to send every outcome)")
					good = false
				}
				for j, oi := range ois {
					opath := fmt.Sprintf("%s.outcomes[%d]", ipath, j)
					o, oat, ok := l.t.str(oi, opath, "an outcome")
					if !ok {
						good = false
						continue
					}
					if !slices.Contains(WebhookOutcomes, o) {
						l.errAt(oat, opath, fmt.Sprintf("%q is not an outcome of a tool call (use one of %s)", o, strings.Join(WebhookOutcomes, ", ")))
						good = false
						continue
					}
					we.Outcomes = append(we.Outcomes, o)
				}
			}
			out = append(out, we)
			continue
		}
		s, sat, ok := l.t.str(item, ipath, "an event type")
		if !ok || !checkType(s, sat, ipath) {
			good = false
			continue
		}
		out = append(out, WebhookEvent{Type: s})
	}
	return out, good
}

// mappingNode reports whether n, aliases looked through, is a mapping.
func mappingNode(t *tree, n ast.Node, path string) (ast.Node, bool) {
	for i := 0; i <= maxDepth; i++ {
		switch v := n.(type) {
		case *ast.AnchorNode:
			n = v.Value
		case *ast.TagNode:
			n = v.Value
		case *ast.AliasNode:
			r, ok := t.resolve(n, path)
			if !ok {
				return nil, false
			}
			n = r.n
		case *ast.MappingNode:
			return v, true
		default:
			return n, false
		}
	}
	return n, false
}
