package snapshot

// testHooks stop an operation at a point where a concurrent one may run, so
// tests replay the interleavings that matter deterministically. They are
// nil outside tests.
var testHooks struct {
	mountsAfterRead  func()       // Mounts: after its read, before it builds the mount
	createInTx       func() error // create: in its transaction, directories in place
	createFailed     func()       // create: after a failed creation's transaction
	makeMappedParent func() error // create: before it mounts a new mapped parent
	removingDirs     func()       // Remove: after its transaction, before the directories go
	orphansListed    func()       // RemoveOrphans: orphans moved out of place, none removed yet
}
