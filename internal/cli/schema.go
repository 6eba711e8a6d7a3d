package cli

import (
	"flag"
	"fmt"

	"github.com/timebox-run/timebox/config"
)

const schemaUsage = `usage: timebox schema > agent.schema.json

Prints the JSON Schema (draft 2020-12) of the agent file. Name it on the
first line of an agent file,

  # yaml-language-server: $schema=agent.schema.json

and editors that use yaml-language-server complete its keys, describe each
one, and underline unknown keys as you type. The schema checks the keys and
the form of each value; timebox validate checks everything. Reference:
docs/agent-file.md.
`

// cmdSchema prints the agent file's JSON Schema (config.Schema).
func cmdSchema(args []string, o IO) int {
	fs := flag.NewFlagSet("timebox schema", flag.ContinueOnError)
	fs.SetOutput(o.Err)
	fs.Usage = func() { fmt.Fprint(o.Err, schemaUsage) }
	if err := fs.Parse(args); err != nil {
		return usageExit(err)
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(o.Err, "timebox schema: unexpected argument %q\n\n%s", fs.Arg(0), schemaUsage)
		return ExitUsage
	}
	if _, err := o.Out.Write(config.Schema()); err != nil {
		fmt.Fprintln(o.Err, "timebox schema:", err)
		return ExitFailed
	}
	return ExitOK
}
