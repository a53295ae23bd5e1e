package main

import (
	"fmt"
	"io"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/grouped-snapshotter/grouped-snapshotter/config"
	"github.com/grouped-snapshotter/grouped-snapshotter/crihandler"
)

// runtimeHandlerCommand prints the containerd drop-in of a CRI runtime
// handler that runs pods on grouped (install.sh --runtime-handler).
func runtimeHandlerCommand() *cli.Command {
	return &cli.Command{
		Name:      "runtime-handler",
		Usage:     "read `containerd config dump` on stdin and print a drop-in declaring a CRI runtime handler that runs its pods on grouped (a copy of the default handler)",
		ArgsUsage: " ",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "name", Value: config.Name, Usage: "the handler's name, which a RuntimeClass names"},
			&cli.StringFlag{Name: "snapshotter", Value: config.Name, Usage: "grouped-snapshotter's name in containerd's config"},
		},
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return fmt.Errorf("runtime-handler takes no arguments (got %q): it reads containerd's configuration on stdin", c.Args().Slice())
			}
			dump, err := io.ReadAll(os.Stdin)
			if err != nil {
				return fmt.Errorf("read containerd's configuration from stdin: %w", err)
			}
			out, err := crihandler.Render(dump, c.String("name"), c.String("snapshotter"))
			if err != nil {
				return err
			}
			_, err = os.Stdout.Write(out)
			return err
		},
	}
}
