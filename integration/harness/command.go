package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Command is one run of a command-line tool the tests drive (ctr, crictl,
// nerdctl, kubectl, iptables, ...).
type Command struct {
	// Bin is the executable.
	Bin string
	// Global are arguments before Args that errors leave out (addresses,
	// config files), so that an error names the command as a test wrote it.
	Global []string
	Args   []string
	// Env entries are added to the caller's environment.
	Env []string
	// Stdin, if not nil, is the command's standard input.
	Stdin []byte
	// Timeout bounds the run when ctx has no deadline; 0 means no bound.
	Timeout time.Duration
}

// Run runs the command and returns its stdout. A failure's error names the
// tool and Args and carries stderr and stdout.
func (c Command) Run(ctx context.Context) (string, error) {
	if _, ok := ctx.Deadline(); !ok && c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	cmd := exec.CommandContext(ctx, c.Bin, append(append([]string{}, c.Global...), c.Args...)...)
	if len(c.Env) > 0 {
		cmd.Env = append(os.Environ(), c.Env...)
	}
	if c.Stdin != nil {
		cmd.Stdin = bytes.NewReader(c.Stdin)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		name := c.Bin[strings.LastIndex(c.Bin, "/")+1:]
		return stdout.String(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(c.Args, " "), err,
			strings.TrimSpace(stderr.String()+"\n"+stdout.String()))
	}
	return stdout.String(), nil
}
