// Package mountopts turns a chain of layers kept under one shared parent
// directory into the single mount a container rootfs needs, and checks that
// the kernel will take that mount as the shim will issue it.
//
// Every layer of grouped-snapshotter lives directly under one parent
// directory with a short name, so a chain of up to 500 layers fits the one
// page of mount data the kernel accepts once containerd's shim rewrites the
// lowerdirs relative to their common parent. The package builds mounts and
// checks them; it mounts nothing itself. Idmapped mounts of the layer parent
// are package mappedparent's.
package mountopts
