// Package harness drives a real, private containerd 2.x against the
// grouped-snapshotter daemon for integration tests and the demo.
//
// An Env owns one temporary directory holding everything it starts: a local
// plain-HTTP registry (crane registry serve), the grouped-snapshotter daemon
// built from this repository, and a containerd with its own root, state,
// gRPC address and config that registers the daemon as the "grouped" proxy
// snapshotter. Test images are built from Debian's static busybox and pushed
// to the registry with crane.
//
// Close removes everything the Env made: it deletes its containers through
// containerd, stops only the processes it started (by PID), unmounts whatever
// is left under its directory and removes the directory. Shim sockets, runc
// state and ctr's FIFOs are kept in that directory too (see Env.Ctr), so the
// harness never touches /run/containerd, which other containerds share.
//
// The pinned tools (containerd, ctr, containerd-shim-runc-v2, runc, crane) are
// taken from $GS_TOOLS_BIN, or <repo>/.tools/bin as built by
// hack/install-tools.sh.
package harness
