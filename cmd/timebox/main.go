// Command timebox runs LLM agent turns in honest, enforced, explained and
// measured time budgets. See `timebox help`.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/timebox-run/timebox/internal/cli"
)

func main() {
	if err := cli.HideProcess(); err != nil {
		fmt.Fprintf(os.Stderr, "timebox: cannot hide its environment from its tools: %v\n", err)
	}
	os.Exit(cli.Run(context.Background(), os.Args[1:], cli.Std()))
}
