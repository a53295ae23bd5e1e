package main

// runtime-handler renders a CRI runtime handler whose pods run on
// grouped-snapshotter while CRI's default snapshotter stays containerd's
// in-process overlayfs: only the pods that name the handler (through a
// RuntimeClass) pay a gRPC round trip per snapshotter call, and images
// reach grouped without a second pull: borrowed from overlayfs as they come
// (borrow_from), or unpacked by CRI from the content store when such a
// pod's container is made.
//
// The handler is a copy of containerd's default runtime handler, options
// and all, with its snapshotter set: a handler with runc's defaults would
// run the pod with another cgroup driver than the node's other pods.

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"

	"github.com/containerd/errdefs"
	"github.com/pelletier/go-toml/v2"
	"github.com/urfave/cli/v2"

	"github.com/grouped-snapshotter/grouped-snapshotter/config"
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
			out, err := renderRuntimeHandler(dump, c.String("name"), c.String("snapshotter"))
			if err != nil {
				return err
			}
			_, err = os.Stdout.Write(out)
			return err
		},
	}
}

// criRuntimePlugin is CRI's runtime plugin in containerd 2.x's
// configuration (version 3).
const criRuntimePlugin = "io.containerd.cri.v1.runtime"

// handlerName is what Kubernetes takes as a RuntimeClass handler: a DNS
// label.
var handlerName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// renderRuntimeHandler reads containerd's merged configuration, as `containerd config
// dump` prints it, and returns a containerd configuration file (version 3,
// for containerd's imports) that declares runtime handler name: the
// default handler with snapshotter set. A handler called name that runs on
// another snapshotter is refused; one on snapshotter (an earlier install)
// is replaced.
func renderRuntimeHandler(dump []byte, name, snapshotter string) ([]byte, error) {
	if !handlerName.MatchString(name) {
		return nil, fmt.Errorf("runtime handler name %q is not a DNS label (lower-case letters, digits and '-', at most 63), as a RuntimeClass handler must be: %w", name, errdefs.ErrInvalidArgument)
	}
	var cfg map[string]any
	if err := toml.Unmarshal(dump, &cfg); err != nil {
		return nil, fmt.Errorf("parse containerd's configuration: %w", err)
	}
	cri, ok := table(cfg, "plugins", criRuntimePlugin, "containerd")
	if !ok {
		return nil, fmt.Errorf("containerd's configuration has no [plugins.'%s'.containerd] table: is it containerd 2.x with CRI enabled? %w", criRuntimePlugin, errdefs.ErrFailedPrecondition)
	}
	defaultName, _ := cri["default_runtime_name"].(string)
	defaultName = cmp.Or(defaultName, "runc")
	runtimes, _ := table(cri, "runtimes")
	base, ok := table(runtimes, defaultName)
	switch {
	case !ok:
		return nil, fmt.Errorf("containerd's configuration has no runtime handler %q, its default_runtime_name: %w", defaultName, errdefs.ErrFailedPrecondition)
	case name == defaultName:
		return nil, fmt.Errorf("runtime handler %q is containerd's default one: choose another name, so that only the pods that name it run on %s: %w", name, snapshotter, errdefs.ErrInvalidArgument)
	}
	if old, ok := table(runtimes, name); ok && old["snapshotter"] != snapshotter {
		return nil, fmt.Errorf("containerd already has a runtime handler %q (snapshotter %q): choose another name: %w", name, old["snapshotter"], errdefs.ErrAlreadyExists)
	}
	handler := maps.Clone(base)
	handler["snapshotter"] = snapshotter
	out, err := toml.Marshal(map[string]any{
		"version": 3,
		"plugins": map[string]any{criRuntimePlugin: map[string]any{"containerd": map[string]any{"runtimes": map[string]any{name: handler}}}},
	})
	if err != nil {
		return nil, fmt.Errorf("render runtime handler %q: %w", name, err)
	}
	header := fmt.Sprintf("# Runtime handler %q: containerd's default handler %q with snapshotter = %q.\n"+
		"# Pods run on %s when their RuntimeClass names handler %q; all others stay on CRI's snapshotter.\n"+
		"# Rendered from containerd's configuration by grouped-snapshotter: render it again after changing %q.\n",
		name, defaultName, snapshotter, snapshotter, name, defaultName)
	return append([]byte(header), out...), nil
}

// table walks nested TOML tables.
func table(m map[string]any, path ...string) (map[string]any, bool) {
	for _, k := range path {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil, false
		}
		m = next
	}
	return m, true
}
