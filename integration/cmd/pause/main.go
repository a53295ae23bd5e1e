// Command pause is the sandbox ("pause") process of the integration tests'
// CRI pods. It holds the pod's namespaces open, reaps the orphans the kernel
// re-parents to it (it is PID 1 of the pod) and exits cleanly on SIGTERM or
// SIGINT, as the kubelet's pause image does. The harness builds it as a
// static binary and pushes it as a one-layer image, so CRI needs no image
// from the internet.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range sigs {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every exited child without blocking: one SIGCHLD may stand
// for several exits.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
