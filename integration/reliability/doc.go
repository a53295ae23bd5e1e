// Package reliability proves that grouped-snapshotter loses nothing and
// leaks nothing under crashes, restarts, load and bad input, and that what
// it creates on the host is closed to other users.
//
// Its tests run the real daemon binary as a separate process, with a root
// and socket of their own, and talk to it over the socket with containerd's
// own proxy client; the restart and pull tests also drive a private
// containerd through integration/harness. They must run as root:
//
//	go test ./integration/reliability/
//
// The crash test is seeded: GS_CRASH_SEED and GS_CRASH_KILLS replay or
// lengthen a run. It keeps a model of every write the daemon acknowledged
// and checks it after each kill; it fails unless at least half the kills
// cut a write short. A SIGKILL keeps the page cache, so durability against
// power loss is checked apart: TestMetadataWritesAreSynced counts the
// daemon's fsync-family calls per acknowledged write with tracefs.
package reliability
