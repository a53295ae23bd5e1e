// Package mappedparent mounts and unmounts mapped parents: read-only
// idmapped mounts of the layer parent directory, one per UID/GID mapping,
// through which user-namespaced snapshots read their layers, so that a
// container's overlay stays one mount of short lowerdirs. It uses
// open_tree, mount_setattr(MOUNT_ATTR_IDMAP) and move_mount, with user
// namespaces from containerd's mount.GetUsernsFD. Which names exist and who
// uses them is package snapshot's registry; every start unmounts all of
// them and mounts the registered ones, so no mount is trusted across runs.
package mappedparent
