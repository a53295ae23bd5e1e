// Package mountgroup is the kernel side of mounting a group of layers kept
// under one parent directory: the one overlay mount a container's rootfs
// needs, the user-namespace mappings of containerd's snapshot labels, and
// the mapped parents (read-only idmapped mounts of the layer parent, one
// per mapping) through which user-namespaced snapshots read their layers.
//
// Every layer lives directly under one parent directory with a short name,
// so a chain of up to 500 layers fits the one page of mount data the kernel
// accepts once containerd's shim rewrites the lowerdirs relative to their
// common parent; Overlay builds that mount and CheckMountData checks it as
// the shim will issue it. FromLabels parses the containerd.io/snapshot/
// {uid,gid}mapping labels strictly: the kernel rejects many mappings only
// when a user namespace is made from them, at container start, far from the
// cause. Parents mounts and unmounts mapped parents with open_tree,
// mount_setattr(MOUNT_ATTR_IDMAP) and move_mount, with user namespaces from
// containerd's mount.GetUsernsFD; which of them exist and who uses them is
// package snapshot's registry.
package mountgroup
