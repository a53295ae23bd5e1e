// Package bench measures, side by side in one run, what grouped-snapshotter
// saves against containerd's built-in overlayfs snapshotter, on real
// containerd releases driven through the integration harness.
//
// The contenders are grouped-snapshotter with idmap = "mapped" (configured
// by its release-1 name, which every build of an A/B reads), the same
// daemon with idmap = "shim", and containerd's overlayfs. Each runs behind
// its own private containerd of the same release, configured identically
// but for the snapshotter, and every comparison runs the contenders
// interleaved (A B C, B C A, C A B, ...) within one run, so that drift of
// the machine hits all of them alike.
//
// Scenarios (see Config): mount-family syscalls per container start, a
// burst of user-namespaced containers started at once, pull and unpack,
// snapshot API latency over the daemon's socket, and the daemon's memory.
// Headline is make bench's selection (grouped view against overlayfs:
// bursts, pulls and mount calls per start, within 20 minutes), Full make
// bench-full's (everything), and AB make bench-ab's: grouped view from two
// builds of grouped-snapshotter, B ÷ A. Run writes the raw Results;
// Markdown and Charts render them. The command bench/cmd/bench drives it.
package bench
