package cli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/timebox-run/timebox/internal/fakellm"
)

// openAIAgent writes an agent file for a fake OpenAI-compatible endpoint;
// extra is added to its model mapping.
func openAIAgent(t *testing.T, s *fakellm.Server, extra string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "agent.yaml")
	yaml := fmt.Sprintf("model: {primary: 'openai:gpt-x'%s}\nproviders: {openai: {base_url: %q, credentials: [{api_key_env: FAKE_KEY}]}}\n", extra, s.BaseURL())
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRunReplyTooLong: `timebox run` against a model that never stops
// streaming stops at limits.max_reply, exits 3 (stopped by a budget) and
// tells the person what happened and which knob — as its source says —
// changes it; model.max_tokens reaches the provider as
// max_completion_tokens.
func TestRunReplyTooLong(t *testing.T) {
	s := fakellm.New(fakellm.OpenAI, fakellm.Reply{Repeat: true, Chunks: []fakellm.Chunk{{Text: strings.Repeat("on and on ", 1600)}}})
	defer s.Close()
	file := openAIAgent(t, s, ", max_tokens: 1000")
	cases := []struct {
		name  string
		env   []string
		flags []string
		want  []string
	}{
		{name: "default", want: []string{"grew past 1MiB, the limit for one reply (limits.max_reply)", "raise limits.max_reply"}},
		{name: "env", env: []string{"TIMEBOX_MAX_REPLY=32KiB"},
			want: []string{"grew past 32KiB, the limit for one reply (TIMEBOX_MAX_REPLY)", "raise TIMEBOX_MAX_REPLY"}},
		{name: "flag", env: []string{"TIMEBOX_MAX_REPLY=32KiB"}, flags: []string{"--max-reply", "64KiB"},
			want: []string{"grew past 64KiB, the limit for one reply (--max-reply)", "raise --max-reply"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"run", "-f", file, "--no-store"}, tc.flags...)
			r := run(t, append([]string{"FAKE_KEY=k"}, tc.env...), append(args, "Go on for ever.")...)
			if r.code != 3 {
				t.Fatalf("exit %d, want 3\n%s\n%s", r.code, r.out, r.err)
			}
			want := append([]string{"■ stopped (reply_too_long)", "the reply of model gpt-x", "No other model was tried",
				"Partial answer: on and on", "more; --json or timebox runs show prints it whole)"}, tc.want...)
			for _, w := range want {
				if !strings.Contains(r.out, w) {
					t.Errorf("output lacks %q:\n%.2000s", w, r.out)
				}
			}
			if len(r.out) > 8<<10 {
				t.Errorf("%d bytes of output: the partial answer is printed whole", len(r.out))
			}
		})
	}
	for _, req := range s.Requests() {
		if req.Body["max_completion_tokens"] != 1000.0 {
			t.Fatalf("max_completion_tokens %v, want model.max_tokens (1000)", req.Body["max_completion_tokens"])
		}
	}
}
