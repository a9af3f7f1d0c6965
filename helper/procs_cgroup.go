//go:build go1.20

package main

import "syscall"

// forkExecInCgroup creates the process inside the cgroup v2 directory (clone3
// CLONE_INTO_CGROUP), so that nothing it runs ever starts outside it.
func forkExecInCgroup(cgroup, path string, argv []string, attr *syscall.ProcAttr) (int, error) {
	fd, err := syscall.Open(cgroup, syscall.O_DIRECTORY|syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, failf("other", "cgroup %s: %v", cgroup, err)
	}
	defer syscall.Close(fd)
	sys := *attr.Sys
	sys.UseCgroupFD, sys.CgroupFD = true, fd
	in := *attr
	in.Sys = &sys
	return syscall.ForkExec(path, argv, &in)
}
