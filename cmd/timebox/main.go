// Command timebox runs LLM agent turns in honest, enforced, explained and
// measured time budgets. See `timebox help`.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/timebox-run/timebox/internal/cli"
	"github.com/timebox-run/timebox/internal/proctree"
)

func main() {
	if err := cli.HideProcess(); err != nil {
		fmt.Fprintf(os.Stderr, "timebox: cannot hide its environment from its tools: %v\n", err)
	}
	// As a container's PID 1 (no init before it), timebox reaps the
	// orphans its tools leave, which would stay zombies.
	proctree.ReapAdopted(false)
	os.Exit(cli.Run(context.Background(), os.Args[1:], cli.Std()))
}
