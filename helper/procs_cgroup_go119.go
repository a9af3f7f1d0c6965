//go:build !go1.20

package main

import (
	"os"
	"strconv"
	"syscall"
)

// Go before 1.20 (Debian 12's is 1.19) cannot create a process inside a cgroup. Here
// the process starts as this program, parked on a pipe: the manager writes its pid into
// the cgroup's cgroup.procs (the kernel checks the same delegation rules as for
// CLONE_INTO_CGROUP), and only then lets it exec what was asked. So nothing the start
// runs ever runs outside the cgroup, and a cgroup that cannot be joined refuses the
// start, as with the newer toolchain.
func forkExecInCgroup(cgroup, path string, argv []string, attr *syscall.ProcAttr) (int, error) {
	procs, err := os.OpenFile(cgroup+"/cgroup.procs", os.O_WRONLY, 0)
	if err != nil {
		return 0, failf("other", "cgroup %s: %v", cgroup, err)
	}
	defer procs.Close()
	var gate [2]int
	if err := syscall.Pipe2(gate[:], syscall.O_CLOEXEC); err != nil {
		return 0, failf("other", "cgroup %s: %v", cgroup, err)
	}
	defer syscall.Close(gate[1])
	parked := *attr
	parked.Files = append(append([]uintptr(nil), attr.Files...), uintptr(gate[0]))
	wrapped := append([]string{self, cgroupWaitArg, strconv.Itoa(len(attr.Files)), path}, argv...)
	pid, err := syscall.ForkExec(self, wrapped, &parked)
	syscall.Close(gate[0])
	if err != nil {
		return 0, err
	}
	_, err = procs.WriteString(strconv.Itoa(pid))
	if err == nil {
		_, err = syscall.Write(gate[1], []byte{1})
	}
	if err != nil {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		_, _ = syscall.Wait4(pid, nil, 0, nil)
		return 0, failf("other", "cgroup %s: %v", cgroup, err)
	}
	return pid, nil
}

const cgroupWaitArg = "--cgroup-wait"

// The parked process is this program started as `--cgroup-wait FD PATH ARGV...`; it is
// dispatched before main, which belongs to the modes the newer toolchain has as well.
func init() {
	if len(os.Args) >= 5 && os.Args[1] == cgroupWaitArg {
		cgroupWaitMain(os.Args[2], os.Args[3], os.Args[4:])
	}
}

// cgroupWaitMain waits for the manager's go (EOF: it refused the start) and execs
// PATH, without the gate's descriptor. PATH was found by the manager before the start,
// so an exec that fails here is as rare as one that fails after --as switched user.
func cgroupWaitMain(fdArg, path string, argv []string) {
	fd, err := strconv.Atoi(fdArg)
	if err != nil {
		os.Exit(126)
	}
	var b [1]byte
	n, _ := syscall.Read(fd, b[:])
	syscall.Close(fd)
	if n != 1 {
		os.Exit(126)
	}
	err = syscall.Exec(path, argv, os.Environ())
	os.Stderr.WriteString("corral-exec: " + argv[0] + ": " + err.Error() + "\n")
	os.Exit(127)
}
