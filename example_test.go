package timebox_test

import (
	"context"
	"fmt"
	"strings"

	"github.com/timebox-run/timebox"
	"github.com/timebox-run/timebox/agent"
	"github.com/timebox-run/timebox/tool"
)

// Open the demo agent file, add a Go-function tool, and look at the
// resolved budgets.
func ExampleOpen() {
	type input struct {
		Text string `json:"text"`
	}
	shout := tool.Typed("shout", "Upper-cases a text.", func(ctx context.Context, in input, p tool.Progress) (string, error) {
		return strings.ToUpper(in.Text), nil
	})
	a, err := timebox.Open(context.Background(), "examples/demo/agent.yaml", timebox.Options{
		Tools: []agent.Tool{{Tool: shout}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	for _, t := range a.Tools() {
		b := t.Budget
		fmt.Printf("%s %s %s %s\n", t.Tool.Spec().Name, b.Timeout.D, b.Timeout.Source, b.Enforcement)
	}
	// Output:
	// word_count 5s profile:fast hard
	// crawl 10s tool hard
	// web_fetch 1s tool hard
	// legacy_sync 1s tool hard
	// report 1s tool advisory
	// shout 1m0s default cooperative
}
