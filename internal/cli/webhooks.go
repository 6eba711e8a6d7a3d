package cli

import (
	"fmt"
	"io"
	"strings"

	"github.com/timebox-run/timebox/config"
	"github.com/timebox-run/timebox/event"
	"github.com/timebox-run/timebox/server"
)

// serverWebhooks returns the agent file's webhooks for the server, each
// with the key its secret_env variable holds; an error names every
// variable that is unset or holds no whsec_ secret.
func serverWebhooks(cfg *config.Agent, o IO) ([]server.Webhook, error) {
	keys, err := cfg.WebhookSecrets(o.getenv)
	if err != nil {
		return nil, err
	}
	var out []server.Webhook
	for i, w := range cfg.Server.Webhooks {
		h := server.Webhook{URL: w.URL, Secret: keys[i]}
		for _, e := range w.Events {
			we := server.WebhookEvent{Type: event.Type(e.Type)}
			for _, oc := range e.Outcomes {
				we.Outcomes = append(we.Outcomes, event.Outcome(oc))
			}
			h.Events = append(h.Events, we)
		}
		out = append(out, h)
	}
	return out, nil
}

// writeWebhooks prints the agent file's webhooks for validate: each
// receiver, what it is sent, and whether its secret is set (never the
// secret).
func writeWebhooks(w io.Writer, cfg *config.Agent, getenv func(string) string) {
	if len(cfg.Server.Webhooks) == 0 {
		return
	}
	fmt.Fprintln(w, "\nwebhooks (timebox serve):")
	for _, h := range cfg.Server.Webhooks {
		var evs []string
		for _, e := range h.Events {
			if len(e.Outcomes) > 0 {
				evs = append(evs, e.Type+"("+strings.Join(e.Outcomes, "|")+")")
			} else {
				evs = append(evs, e.Type)
			}
		}
		secret := "set"
		if v := getenv(h.SecretEnv); v == "" {
			secret = "NOT SET"
		} else if _, err := config.WebhookSecret(v); err != nil {
			secret = "not a whsec_ secret"
		}
		fmt.Fprintf(w, "  %s\n    events: %s\n    secret: %s (%s)\n", h.URL, strings.Join(evs, ", "), h.SecretEnv, secret)
	}
}
