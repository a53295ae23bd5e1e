//go:build !(linux && amd64)

package userns

func rawCloneUserns(flags, stack, ppid uintptr) (pid, errno uintptr) {
	panic("rawCloneUserns: not on this architecture")
}

const haveCloneUserns = false
