package main

import (
	"slices"

	"github.com/urfave/cli/v2"
)

// The application's flags (serveFlags) are global: every command reads
// them, and its own flags of the same names, through flagString and
// flagIsSet. They take a flag from the innermost command line that set it,
// so `grouped-snapshotter --address X ls` and `grouped-snapshotter ls
// --address X` mean the same, and a command's own flag wins when both are
// given. urfave/cli alone would not do this: c.String finds the innermost
// command that defines a flag and returns its default even when only the
// global one was set.

// setIn returns the context, innermost first, whose command line (or
// environment) set flag name, or nil.
func setIn(c *cli.Context, name string) *cli.Context {
	for _, ctx := range c.Lineage() {
		if slices.Contains(ctx.LocalFlagNames(), name) {
			return ctx
		}
	}
	return nil
}

// flagString returns the value of flag name from the innermost command
// line that set it, else the innermost definition's default.
func flagString(c *cli.Context, name string) string {
	if ctx := setIn(c, name); ctx != nil {
		return ctx.String(name)
	}
	return c.String(name)
}

// flagIsSet reports whether any command line of c's lineage set name.
func flagIsSet(c *cli.Context, name string) bool { return setIn(c, name) != nil }
