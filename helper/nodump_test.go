package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Every mode of corral-exec is non-dumpable from its start: its descriptors, memory and
// environment are closed to the workload, root included (it lacks CAP_SYS_PTRACE).
func TestNotDumpable(t *testing.T) {
	dumpable, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_GET_DUMPABLE, 0, 0)
	if errno != 0 || dumpable != 0 {
		t.Fatalf("this process is dumpable (%d, %v)", dumpable, errno)
	}
	if os.Getuid() != 0 {
		t.Fatal("run as root: the check below starts the helper as another user")
	}
	// A non-dumpable process's /proc entries belong to root, whoever it runs as.
	cmd := exec.Command(copyForAnyone(t), "--procs-stdio")
	cmd.Env = append(os.Environ(), asMainVar+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	time.Sleep(200 * time.Millisecond) // past its start, into serving
	proc := "/proc/" + strconv.Itoa(cmd.Process.Pid)
	status, err := os.ReadFile(proc + "/status")
	if err != nil || !strings.Contains(string(status), "\nUid:\t65534\t") {
		t.Fatalf("the helper does not run as 65534 (%v): %s", err, status)
	}
	var fds syscall.Stat_t
	if err := syscall.Stat(proc+"/fd", &fds); err != nil || fds.Uid != 0 {
		t.Fatalf("its fds belong to uid %d (%v): it is dumpable", fds.Uid, err)
	}
}

// copyForAnyone copies this test binary where another user can run it.
func copyForAnyone(t *testing.T) string {
	dir, err := os.MkdirTemp("", "corral-nodump")
	if err == nil {
		t.Cleanup(func() { _ = os.RemoveAll(dir) })
		err = os.Chmod(dir, 0o755)
	}
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "corral-exec")
	if err := os.WriteFile(path, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}
