package exactjson_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/timebox-run/timebox/internal/exactjson"
)

// TestObject: a body is one JSON object and nothing after it, each
// key at most once and, when the keys are given, one of them to the
// letter; what encoding/json alone would take ("INPUT" for "input", the
// last of a key given twice, garbage after the object) is refused with a
// sentence that names the key.
func TestObject(t *testing.T) {
	keys := []string{"decision", "reason"}
	for _, c := range []struct {
		name, body string
		keys       []string
		want       map[string]string // the fields' raw values; nil when refused
		says       string
	}{
		{"the keys", `{"decision": "approve", "reason": "ok"}`, keys, map[string]string{"decision": `"approve"`, "reason": `"ok"`}, ""},
		{"some of them", ` {"reason": {"a": [1]}} `, keys, map[string]string{"reason": `{"a": [1]}`}, ""},
		{"empty", `{}`, keys, map[string]string{}, ""},
		{"any keys", `{"turn": "1s", "TURN": 5}`, nil, map[string]string{"turn": `"1s"`, "TURN": `5`}, ""},
		{"another case", `{"Decision": "approve"}`, keys, nil, `unknown field "Decision" (did you mean decision? the keys are decision, reason, matched exactly)`},
		{"misspelt", `{"reasno": "x"}`, keys, nil, `unknown field "reasno" (did you mean reason? the keys are decision, reason, matched exactly)`},
		{"unknown", `{"decision": "approve", "by": "x"}`, keys, nil, `unknown field "by" (the keys are`},
		{"a key twice", `{"decision": "deny", "decision": "approve"}`, keys, nil, `field "decision" given twice: give each key once`},
		{"any key twice", `{"turn": "1s", "turn": "10m"}`, nil, nil, `field "turn" given twice`},
		{"an escaped key twice", `{"turn": "1s", "t\u0075rn": "10m"}`, nil, nil, `field "turn" given twice`},
		{"garbage after", `{"decision": "approve"} trailing garbage`, keys, nil, "something after the JSON object"},
		{"a second object", `{"decision": "approve"} {}`, keys, nil, "something after the JSON object"},
		{"an array", `["decision"]`, keys, nil, "not a JSON object"},
		{"null", `null`, nil, nil, "not a JSON object"},
		{"nothing", ``, nil, nil, "not a JSON object"},
		{"cut short", `{"decision": "approve"`, keys, nil, "EOF"},
		{"a bad value", `{"decision": approve}`, keys, nil, "invalid character"},
	} {
		t.Run(c.name, func(t *testing.T) {
			fields, err := exactjson.Object([]byte(c.body), c.keys)
			if c.want == nil {
				if err == nil || !strings.Contains(err.Error(), c.says) {
					t.Fatalf("fields %s, error %v; want an error saying %q", fields, err, c.says)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]string{}
			for k, v := range fields {
				got[k] = string(v)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("fields (-want +got):\n%s", diff)
			}
		})
	}
}
