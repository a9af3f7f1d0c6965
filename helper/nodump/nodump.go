// Package nodump makes corral-exec non-dumpable before anything else of it runs: its
// descriptors (/proc/<pid>/fd: the relay's and the exec channel's stdout, which the
// harness reads as frames), its memory and its environment then need CAP_SYS_PTRACE,
// which the sandbox never holds, even for root in it. The main package imports it first,
// and it imports nothing but syscall, so its init runs as soon as the runtime's has.
package nodump

import "syscall"

func init() {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_DUMPABLE, 0, 0); errno != 0 {
		// A process whose channels the workload could write must not speak on them.
		_, _ = syscall.Write(2, []byte("corral-exec: cannot make itself non-dumpable\n"))
		syscall.Exit(125)
	}
}
