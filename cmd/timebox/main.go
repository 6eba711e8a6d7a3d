// Command timebox runs LLM agent turns in honest, enforced, explained and
// measured time budgets. See `timebox help`.
package main

import (
	"context"
	"os"

	"github.com/timebox-run/timebox/internal/cli"
)

func main() {
	os.Exit(cli.Run(context.Background(), os.Args[1:], cli.Std()))
}
