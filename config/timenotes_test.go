package config

import (
	"strings"
	"testing"

	"github.com/timebox-run/timebox/budget"
)

// TestTimeNotes reads context.time_notes, an on/off setting, from the
// file, a flag and a variable, and places a wrong value at file:line:col.
func TestTimeNotes(t *testing.T) {
	const head = "model: {primary: 'script:demo'}\nproviders: {script: {file: script.jsonl}}\n"
	for _, tc := range []struct {
		name, file string
		o          Overrides
		on         bool
		src        budget.Source
		err        string
	}{
		{name: "default", on: true, src: budget.SourceDefault},
		{name: "file off", file: "context: {time_notes: off}\n", src: budget.SourceFile},
		{name: "file on", file: "context:\n  time_notes: 'on'\n", on: true, src: budget.SourceFile},
		{name: "flag over file", file: "context: {time_notes: on}\n", o: Overrides{Flags: map[string]string{KeyTimeNotes: "off"}}, src: budget.SourceFlag},
		{name: "env", o: Overrides{Env: []string{"TIMEBOX_TIME_NOTES=OFF"}}, src: budget.SourceEnv},
		{name: "a boolean", file: "context:\n  time_notes: true\n", err: `agent.yaml:4:15: context.time_notes: true is not on or off (write on or off)`},
		{name: "a number", file: "context: {time_notes: 0}\n", err: `context.time_notes: 0 is not on or off`},
		{name: "bad flag", o: Overrides{Flags: map[string]string{KeyTimeNotes: "yes"}}, err: `--time-notes: "yes" is not on or off`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, err := Load(writeAgent(t, head+tc.file), tc.o)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if a.Context.TimeNotes != tc.on || a.Context.TimeNotesSource != tc.src {
				t.Errorf("time notes %v from %s, want %v from %s", a.Context.TimeNotes, a.Context.TimeNotesSource, tc.on, tc.src)
			}
		})
	}
}
