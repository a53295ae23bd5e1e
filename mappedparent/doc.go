// Package mappedparent is the kernel side of idmapped mounts of the layer
// parent: it mounts and unmounts them, and probes whether the kernel and
// filesystem support them.
//
// Snapshots of a container with a user namespace read their layers through
// a read-only idmapped mount of the layer parent directory, one per
// UID/GID mapping, so that the container's overlay stays one mount of
// short lowerdirs. This package makes such a mount with open_tree,
// mount_setattr(MOUNT_ATTR_IDMAP) and move_mount. Which names exist and who
// uses them is the snapshotter's registry (package snapshot), and every
// start unmounts all of them and mounts the registered ones, so a mount is
// never trusted across runs. The user-namespace file descriptors come from
// containerd's mount.GetUsernsFD.
package mappedparent
