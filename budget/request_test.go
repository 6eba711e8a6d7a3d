package budget_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/timebox-run/timebox/budget"
)

// TestRequestUnmarshalJSON: a request's budgets are read by exactjson's
// rule, so a name given twice is refused rather than the last one taken;
// numbers are read as the agent file writes them, and null is no budgets.
func TestRequestUnmarshalJSON(t *testing.T) {
	for _, c := range []struct {
		name, body string
		want       budget.Request
		says       string
	}{
		{"strings and numbers", `{"turn": "10m", "max_steps": 5}`, budget.Request{"turn": "10m", "max_steps": "5"}, ""},
		{"empty", `{}`, budget.Request{}, ""},
		{"null", `null`, nil, ""},
		{"a name twice", `{"turn": "1s", "turn": "10m"}`, nil, `budgets: field "turn" given twice: give each key once`},
		{"not an object", `["turn", "1s"]`, nil, "budgets: not a JSON object"},
		{"not a value", `{"turn": true}`, nil, `budgets.turn: want a string such as "90s" or a number, got true`},
	} {
		t.Run(c.name, func(t *testing.T) {
			var got budget.Request
			err := json.Unmarshal([]byte(c.body), &got)
			if c.says != "" {
				if err == nil || !strings.Contains(err.Error(), c.says) {
					t.Fatalf("%v, error %v; want an error saying %q", got, err, c.says)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("budgets (-want +got):\n%s", diff)
			}
		})
	}
	// Inside a larger value, as the server reads a turn's body.
	var body struct {
		Budgets budget.Request `json:"budgets"`
	}
	err := json.Unmarshal([]byte(`{"budgets": {"turn": "1s", "turn": "10m"}}`), &body)
	if err == nil || !strings.Contains(err.Error(), `field "turn" given twice`) {
		t.Errorf("a name twice inside a body: %v, error %v", body.Budgets, err)
	}
}

// TestAMisspeltRequestBudgetIsNamed: a request's budget a letter away
// from one it may set gets the one meant, as a misspelt agent-file key
// does.
func TestAMisspeltRequestBudgetIsNamed(t *testing.T) {
	_, _, err := budget.Request{"trun": "1m"}.Apply(budget.Budgets{}, budget.Limits{}, nil)
	if err == nil || !strings.Contains(err.Error(), "not a budget a request may set (did you mean turn?); it may set ") {
		t.Fatalf("%v", err)
	}
	_, _, err = budget.Request{"kill_grace": "1s"}.Apply(budget.Budgets{}, budget.Limits{}, nil)
	if err == nil || strings.Contains(err.Error(), "did you mean") {
		t.Fatalf("%v", err)
	}
}
