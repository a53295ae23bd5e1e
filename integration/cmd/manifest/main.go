// Command manifest prints the canonical manifest (package
// integration/conformance/manifest) of the root filesystem it runs in. The
// conformance images carry it, statically linked, at /.gs-manifest; it
// leaves itself, the images' salt file and every mount point out.
package main

import (
	"fmt"
	"os"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/conformance/manifest"
)

func main() {
	m, err := manifest.Walk("/", manifest.ToolPaths)
	if err == nil {
		err = manifest.Write(os.Stdout, m)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "manifest:", err)
		os.Exit(1)
	}
}
