package preflight

import (
	"fmt"
	"os"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/internal/mountleak"
)

// TestMain lets this test binary be its own probe child: Run re-executes
// /proc/self/exe with ProbeCommand, as it does grouped-snapshotter.
func TestMain(m *testing.M) {
	if len(os.Args) == 3 && os.Args[1] == ProbeCommand {
		if err := ProbeMain(os.Args[2], os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(mountleak.Run(m))
}
