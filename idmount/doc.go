// Package idmount is the kernel side of idmapped mounts of the layer
// parent: it mounts, verifies, reuses and removes them, and probes whether
// the kernel and filesystem support them.
//
// Snapshots of a container with a user namespace read their layers through
// a read-only idmapped mount of the layer parent directory, one per
// UID/GID mapping, so that the container's overlay stays one mount of
// short lowerdirs. This package makes such a mount with open_tree,
// mount_setattr(MOUNT_ATTR_IDMAP) and move_mount, reads back what is
// mounted at a name with statmount, and replaces a mount whose mapping or
// attributes are not the ones asked for (after a crash or a mapping
// change) instead of serving it. Which names exist and who uses them is
// the snapshotter's registry (package snapshot); the user-namespace file
// descriptors come from containerd's mount.GetUsernsFD.
package idmount
