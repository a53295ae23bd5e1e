// Package deploy holds the node and cluster installation files (systemd
// unit, containerd drop-in written by install.sh, Kubernetes DaemonSet) and
// the tests that keep them valid. It has no Go code of its own.
package deploy
