// Command readme-tables rewrites the README's generated sections (between
// "<!-- BEGIN name" and "<!-- END name -->") from the committed results
// files the integration tests write: the mount-syscall table from
// integration/results/mount-syscalls.json, the Kubernetes pod-start
// figures from integration/k8s/results/latest.json. Run it from the
// repository root (`make readme-tables`); -check only reports whether the
// README is current.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/results"
)

func main() {
	root := flag.String("root", ".", "repository root")
	check := flag.Bool("check", false, "fail if the README differs from the results instead of rewriting it")
	flag.Parse()
	if err := run(*root, *check); err != nil {
		fmt.Fprintln(os.Stderr, "readme-tables:", err)
		os.Exit(1)
	}
}

func run(root string, check bool) error {
	path := filepath.Join(root, "README.md")
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := results.RenderREADME(root, string(data))
	if err != nil {
		return err
	}
	switch {
	case out == string(data):
		return nil
	case check:
		return fmt.Errorf("%s is stale: run `make readme-tables`", path)
	}
	return os.WriteFile(path, []byte(out), 0o644)
}
