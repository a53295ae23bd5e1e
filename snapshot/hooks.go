package snapshot

// testHooks stop an operation at a point where a concurrent one may run, so
// tests replay the interleavings that matter deterministically. They are
// nil outside tests.
var testHooks struct {
	// mountsBeforeMappedParent runs in Mounts after it has read the snapshot and
	// its mapped-parent name, before it touches the mapped parent.
	mountsBeforeMappedParent func()
	// createInTx runs inside create's write transaction after the
	// snapshot's directories are made; an error fails the creation.
	createInTx func() error
	// createFailed runs in create after a failed creation's transaction
	// has ended.
	createFailed func()
	// makeMappedParent runs in a first use before its mapped parent is
	// made, beside the registering transaction; an error stands for the
	// kernel's.
	makeMappedParent func() error
	// orphansListed runs in RemoveOrphans once the orphans are known,
	// before any is removed.
	orphansListed func()
}
