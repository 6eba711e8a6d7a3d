package budget_test

import (
	"reflect"
	"testing"

	"github.com/timebox-run/timebox/budget"
)

// TestEveryFieldHasOneKnob: each field of Budgets and Limits is the place
// of exactly one entry of budget.Knobs, whose key is the field's JSON name
// in its section, so that a budget added to the structs without a knob (or
// twice) fails here.
func TestEveryFieldHasOneKnob(t *testing.T) {
	var b budget.Budgets
	var l budget.Limits
	owner := map[uintptr]string{}
	for _, k := range budget.Knobs {
		var p uintptr
		if d := k.Duration(&b); d != nil {
			p = reflect.ValueOf(d).Pointer()
		} else {
			p = reflect.ValueOf(k.Count(&l)).Pointer()
		}
		if other, dup := owner[p]; dup {
			t.Errorf("%s and %s share a field", other, k.Key)
		}
		owner[p] = k.Key
	}
	for _, s := range []struct {
		section string
		v       reflect.Value
	}{{"timeouts.", reflect.ValueOf(&b).Elem()}, {"limits.", reflect.ValueOf(&l).Elem()}} {
		for i := range s.v.NumField() {
			f := s.v.Type().Field(i)
			key, ok := owner[s.v.Field(i).Addr().Pointer()]
			want := s.section + f.Tag.Get("json")
			if !ok || key != want {
				t.Errorf("%s (%s) is the place of knob %q, want %q", f.Name, want, key, want)
			}
		}
	}
}

// TestStopReasonsHaveOneKnob: a stop reason names at most one knob.
func TestStopReasonsHaveOneKnob(t *testing.T) {
	seen := map[budget.StopReason]string{}
	for _, k := range budget.Knobs {
		if k.Stops == "" {
			continue
		}
		if other, dup := seen[k.Stops]; dup {
			t.Errorf("%s is the stop reason of %s and %s", k.Stops, other, k.Key)
		}
		seen[k.Stops] = k.Key
	}
}

// TestRequestApply: the request check on its own, against the defaults.
func TestRequestApply(t *testing.T) {
	b, l := budget.Defaults(), budget.DefaultLimits()
	nb, nl, err := budget.Request{"turn": "90s", "max_steps": "5", "llm_budget": "1h"}.Apply(b, l, nil)
	if err != nil {
		t.Fatal(err)
	}
	if nb.Turn.D.Seconds() != 90 || nb.Turn.Source != budget.SourceRequest || nl.MaxSteps.N != 5 || nb.LLMBudget.Source != budget.SourceRequest {
		t.Errorf("got turn %+v, max_steps %+v, llm_budget %+v", nb.Turn, nl.MaxSteps, nb.LLMBudget)
	}
	if b.Turn.Source != budget.SourceDefault {
		t.Errorf("Apply changed its input: %+v", b.Turn)
	}
	_, _, err = budget.Request{"tool": "2h"}.Apply(b, l, map[string]int64{"tool": int64(3 * 60 * 60 * 1e9)})
	if re, ok := err.(*budget.RequestError); !ok || re.Name != "tool" || re.Ceiling != "1h" {
		t.Errorf("a tool default over tool_max: %v", err)
	}
}
