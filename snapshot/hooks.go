package snapshot

// testHooks stop an operation at a point where a concurrent one may run, so
// tests replay the interleavings that matter deterministically. They are
// nil outside tests.
var testHooks struct {
	// mountsAfterRead runs in Mounts after its read transaction, before it
	// builds the mount from what it read.
	mountsAfterRead func()
	// createInTx runs inside create's write transaction after the
	// snapshot's directories are in place; an error fails the creation.
	createInTx func() error
	// createFailed runs in create after a failed creation's transaction
	// has ended.
	createFailed func()
	// makeMappedParent runs in a creation after it has read its mapping's
	// mapped parent, before it mounts a new one; an error stands for the
	// kernel's.
	makeMappedParent func() error
	// removingDirs runs in Remove after its transaction, before it removes
	// the snapshot's directories.
	removingDirs func()
	// orphansListed runs in RemoveOrphans once the orphans are moved out of
	// place, before any is removed.
	orphansListed func()
}
