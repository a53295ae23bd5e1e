package preflight

import (
	"fmt"
	"os"
	"time"

	"github.com/containerd/log"
)

// ProbePauseEnv is a test hook. When it names a file, the probe, with its
// idmapped mount and its overlay both mounted, writes "<pid> <dir>" there
// (its process and the directory it mounts in) and waits until the file is
// removed. Only the probe reads it; it lets a test look at a probe, or kill
// it, while its mounts are live, which no timing could do reliably.
const ProbePauseEnv = "GROUPED_SNAPSHOTTER_TEST_PROBE_PAUSE"

// pauseIfAsked implements ProbePauseEnv for the probe mounting in dir.
func pauseIfAsked(dir string) {
	marker := os.Getenv(ProbePauseEnv)
	if marker == "" {
		return
	}
	// Written whole then renamed, so that a test never reads half of it.
	tmp := marker + ".tmp"
	if err := os.WriteFile(tmp, []byte(fmt.Sprintf("%d %s\n", os.Getpid(), dir)), 0o600); err != nil {
		log.L.WithError(err).Warnf("test hook %s: cannot write %q", ProbePauseEnv, tmp)
		return
	}
	if err := os.Rename(tmp, marker); err != nil {
		log.L.WithError(err).Warnf("test hook %s: cannot rename %q", ProbePauseEnv, tmp)
		return
	}
	for {
		if _, err := os.Stat(marker); os.IsNotExist(err) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
