package userns

// rawCloneUserns is clonevm_linux_amd64.s.
func rawCloneUserns(flags, stack, ppid uintptr) (pid, errno uintptr)

const haveCloneUserns = true
