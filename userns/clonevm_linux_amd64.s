#include "textflag.h"

// func rawCloneUserns(flags, stack, ppid uintptr) (pid, errno uintptr)
//
// clone(2) with flags (CLONE_VM|CLONE_NEWUSER|SIGCHLD) and the given stack.
// The child shares the caller's memory, so it must never run Go code: it
// asks for SIGKILL at its parent's death, exits if the parent is already
// gone (its parent is no longer ppid), and otherwise waits in pause(2)
// until it is killed. It touches no memory, its stack included; the caller
// has blocked every signal, and the child inherits that mask, so no
// handler of the caller's ever runs in it.
TEXT ·rawCloneUserns(SB),NOSPLIT,$0-40
	MOVQ	flags+0(FP), DI
	MOVQ	stack+8(FP), SI
	MOVQ	ppid+16(FP), R12	// kept across clone: the child gets a copy
	MOVQ	$0, DX			// parent_tid
	MOVQ	$0, R10			// child_tid
	MOVQ	$0, R8			// tls
	MOVQ	$56, AX			// SYS_clone
	SYSCALL
	CMPQ	AX, $0
	JEQ	child
	CMPQ	AX, $0xfffffffffffff001
	JLS	ok
	MOVQ	$-1, pid+24(FP)
	NEGQ	AX
	MOVQ	AX, errno+32(FP)
	RET
ok:
	MOVQ	AX, pid+24(FP)
	MOVQ	$0, errno+32(FP)
	RET

child:
	MOVQ	$1, DI			// PR_SET_PDEATHSIG
	MOVQ	$9, SI			// SIGKILL
	MOVQ	$157, AX		// SYS_prctl
	SYSCALL
	MOVQ	$110, AX		// SYS_getppid
	SYSCALL
	CMPQ	AX, R12
	JNE	exit
wait:
	MOVQ	$34, AX			// SYS_pause
	SYSCALL
	JMP	wait
exit:
	MOVQ	$0, DI
	MOVQ	$231, AX		// SYS_exit_group
	SYSCALL
	JMP	exit
