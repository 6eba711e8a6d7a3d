package config

import (
	"encoding/base64"
	"slices"
	"strings"
	"testing"
)

// testSecret is a whsec_ secret of 32 bytes.
var testSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))

func TestWebhooks(t *testing.T) {
	const head = "model: {primary: script:s}\nproviders: {script: {file: script.jsonl}}\nserver:\n  webhooks:\n"
	tests := []struct {
		name, body string
		env        []string
		want       string // a part of the error; empty: loads
	}{
		{"ok", "    - {url: https://h.example/x, events: [turn_finished, {type: tool_finished, outcomes: [timed_out]}], secret_env: WH}\n",
			[]string{"WH=" + testSecret}, ""},
		{"secret unset loads", "    - {url: https://h.example/x, events: [turn_finished], secret_env: WH}\n", nil, ""},
		{"approvals", "    - {url: http://127.0.0.1:9/x, events: [approval_requested, approval_decided], secret_env: WH}\n", nil, ""},
		{"not whsec", "    - {url: https://h.example/x, events: [turn_finished], secret_env: WH}\n",
			[]string{"WH=hunter2"}, "agent.yaml:5:71: server.webhooks[0].secret_env: WH is not a whsec_ secret"},
		{"bad base64", "    - {url: https://h.example/x, events: [turn_finished], secret_env: WH}\n",
			[]string{"WH=whsec_!!!"}, "key is not base64"},
		{"scheme", "    - {url: ftp://h.example/x, events: [turn_finished], secret_env: WH}\n", nil,
			`server.webhooks[0].url: "ftp://h.example/x" is not an http(s) URL`},
		{"user info", "    - {url: 'https://u:pw@h.example/x', events: [turn_finished], secret_env: WH}\n", nil, "holds credentials"},
		{"unknown event", "    - {url: https://h.example/x, events: [turn_finishd], secret_env: WH}\n", nil,
			`server.webhooks[0].events[0]: "turn_finishd" is not an event type a webhook can send (did you mean turn_finished?`},
		{"delta refused", "    - {url: https://h.example/x, events: [llm_delta], secret_env: WH}\n", nil, `"llm_delta" is not an event type`},
		{"outcome on other type", "    - {url: https://h.example/x, events: [{type: failover, outcomes: [ok]}], secret_env: WH}\n", nil,
			"outcomes: applies to tool_finished only"},
		{"unknown outcome", "    - {url: https://h.example/x, events: [{type: tool_finished, outcomes: [timeout]}], secret_env: WH}\n", nil,
			`outcomes[0]: "timeout" is not an outcome`},
		{"secret in file", "    - {url: https://h.example/x, events: [turn_finished], secret: whsec_abc}\n", nil,
			"never write a secret in the file"},
		{"missing", "    - {url: https://h.example/x}\n", nil, "server.webhooks[0].events: missing"},
		{"no events", "    - {url: https://h.example/x, events: [], secret_env: WH}\n", nil, "lists no event"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := Load(writeAgent(t, head+tc.body), Overrides{Env: tc.env})
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				if len(a.Server.Webhooks) != 1 || a.Server.Webhooks[0].SecretEnv != "WH" {
					t.Fatalf("webhooks: %+v", a.Server.Webhooks)
				}
				if !slices.Contains(a.Withheld(), "WH") {
					t.Errorf("the secret's variable is not withheld from tools: %q", a.Withheld())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to hold %q", err, tc.want)
			}
			if strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "whsec_abc") {
				t.Errorf("the error repeats the secret: %v", err)
			}
		})
	}
}

func TestWebhookFilter(t *testing.T) {
	w := Webhook{Events: []WebhookEvent{{Type: "turn_finished"}, {Type: "tool_finished", Outcomes: []string{"timed_out"}}}}
	for _, tc := range []struct {
		typ, outcome string
		want         bool
	}{{"turn_finished", "", true}, {"tool_finished", "timed_out", true}, {"tool_finished", "ok", false}, {"failover", "", false}} {
		if got := w.Wants(tc.typ, tc.outcome); got != tc.want {
			t.Errorf("Wants(%s, %s) = %v, want %v", tc.typ, tc.outcome, got, tc.want)
		}
	}
}

func TestWebhookSecrets(t *testing.T) {
	a := &Agent{Server: Server{Webhooks: []Webhook{{SecretEnv: "A"}, {SecretEnv: "B"}}}}
	env := map[string]string{"A": testSecret}
	_, err := a.WebhookSecrets(func(k string) string { return env[k] })
	if err == nil || !strings.Contains(err.Error(), "server.webhooks[1].secret_env: B is not set") {
		t.Fatalf("err = %v", err)
	}
	env["B"] = testSecret
	keys, err := a.WebhookSecrets(func(k string) string { return env[k] })
	if err != nil || len(keys) != 2 || string(keys[0]) != "0123456789abcdef0123456789abcdef" {
		t.Fatalf("keys %q, err %v", keys, err)
	}
}

// TestAnUnpaddedSecretIsRefused: a whsec_ secret whose base64 lacks its
// padding is refused, saying so: Standard Webhooks' verifiers (and the
// docs' Python and Go ones) decode it padded, and could check nothing
// timebox signed with it.
func TestAnUnpaddedSecretIsRefused(t *testing.T) {
	padded := "whsec_6epqvMDTlI1HDjklY3AHmUYNTw/LX9rSqXp5u/5zDy4="
	if _, err := WebhookSecret(padded); err != nil {
		t.Fatalf("padded: %v", err)
	}
	_, err := WebhookSecret(strings.TrimSuffix(padded, "="))
	if err == nil || !strings.Contains(err.Error(), "lacks its padding") {
		t.Fatalf("unpadded: %v", err)
	}
}

// TestAnUnsetSecretIsPlacedInTheFile: the secret serve cannot start
// without is named at the line and column of its secret_env, as every
// other problem of the file is, and a secret too short to sign with is
// said to be too short, not only unpadded (adding the padding would not
// have been the fix).
func TestAnUnsetSecretIsPlacedInTheFile(t *testing.T) {
	path := writeAgent(t, "model: {primary: script:s}\nproviders: {script: {file: script.jsonl}}\nserver:\n  webhooks:\n    - url: https://h.example/x\n      events: [turn_finished]\n      secret_env: WH\n")
	a, err := Load(path, Overrides{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.WebhookSecrets(func(string) string { return "" })
	if want := path + ":7:19: server.webhooks[0].secret_env: WH is not set (set it to the receiver's whsec_ secret)"; err == nil || err.Error() != want {
		t.Errorf("err = %v, want %s", err, want)
	}
	_, err = a.WebhookSecrets(func(string) string { return "whsec_abc" })
	if err == nil || !strings.Contains(err.Error(), path+":7:19: server.webhooks[0].secret_env: WH holds a whsec_ secret of 2 bytes; Standard Webhooks keys are 24 to 64") {
		t.Errorf("err = %v", err)
	}
}
