package mountgroup

import (
	"os"
	"testing"

	"github.com/grouped-snapshotter/grouped-snapshotter/internal/mountleak"
)

func TestMain(m *testing.M) { os.Exit(mountleak.Run(m)) }
