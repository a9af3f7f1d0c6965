package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

var sessionID = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// procsAddress is abstract (a leading @ for Go): nothing in the filesystem to create,
// protect or leave behind, and it goes with the network namespace.
func procsAddress(sid string) *net.UnixAddr {
	return &net.UnixAddr{Name: "@corral-procs-" + sid, Net: "unix"}
}

func checkSessionID(sid string) {
	if !sessionID.MatchString(sid) {
		fmt.Fprintln(os.Stderr, "corral-exec: bad session id")
		os.Exit(2)
	}
}

func procsRelayMain(sid string) {
	checkSessionID(sid)
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	conn, err := dialManager(sid)
	if err == nil {
		err = checkManager(conn)
	}
	if err != nil {
		reason := strings.ReplaceAll(err.Error(), "\n", " ")
		_, _ = os.Stdout.Write(encodeFrame('F', 0, []byte(reason)))
		os.Exit(1)
	}
	ended := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(conn, os.Stdin); ended <- struct{}{} }()
	go func() { _, _ = io.Copy(os.Stdout, conn); ended <- struct{}{} }()
	<-ended
	os.Exit(0)
}

func dialManager(sid string) (*net.UnixConn, error) {
	conn, err := net.DialUnix("unix", nil, procsAddress(sid))
	if errors.Is(err, syscall.ECONNREFUSED) {
		if err := startDaemon(sid); err != nil {
			return nil, fmt.Errorf("starting the process manager: %v", err)
		}
	} else if !errors.Is(err, syscall.EAGAIN) { // EAGAIN: its backlog is full
		return conn, err
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		time.Sleep(10 * time.Millisecond)
		conn, err = net.DialUnix("unix", nil, procsAddress(sid))
		retry := errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.EAGAIN)
		if !retry || time.Now().After(deadline) {
			return conn, err
		}
	}
}

// startDaemon starts the manager detached from this exec: its own session, nothing of
// the exec's (stdio, other inherited fds, cwd) kept.
func startDaemon(sid string) error {
	closeOnExecAll()
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer null.Close()
	fd := null.Fd()
	_, err = syscall.ForkExec("/proc/self/exe", []string{os.Args[0], "--procs-serve", sid}, &syscall.ProcAttr{
		Dir: "/", Env: os.Environ(), Files: []uintptr{fd, fd, fd},
		Sys: &syscall.SysProcAttr{Setsid: true},
	})
	return err
}

// checkManager makes sure the address is held by this same program in this sandbox,
// not by a workload squatting it. corral-exec is non-dumpable (package nodump), so its
// exe link refuses a peer without CAP_SYS_PTRACE: one that shows its exe is not ours
// unless it is this same file.
func checkManager(conn *net.UnixConn) error {
	cred, err := peerCred(conn)
	switch {
	case err != nil:
		return fmt.Errorf("the process manager's credentials: %v", err)
	case int(cred.Uid) != os.Getuid():
		return fmt.Errorf("the process manager's address is held by uid %d", cred.Uid)
	case cred.Pid <= 0:
		return errors.New("the process manager's address is held from outside this PID namespace")
	case !sameExe(cred.Pid):
		return fmt.Errorf("the process manager's address is held by another program (pid %d)", cred.Pid)
	case !sameMounts(cred.Pid):
		return fmt.Errorf("the process manager's address is held from another mount namespace (pid %d)", cred.Pid)
	}
	return nil
}

func peerCred(conn *net.UnixConn) (*syscall.Ucred, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *syscall.Ucred
	var credErr error
	err = raw.Control(func(fd uintptr) {
		cred, credErr = syscall.GetsockoptUcred(int(fd), syscall.SOL_SOCKET, syscall.SO_PEERCRED)
	})
	if err == nil {
		err = credErr
	}
	return cred, err
}

// sameExe: pid runs this program, or is non-dumpable as this program makes itself.
func sameExe(pid int32) bool {
	mine, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return false
	}
	theirs, err := os.Readlink("/proc/" + strconv.Itoa(int(pid)) + "/exe")
	return theirs == mine || errors.Is(err, syscall.EACCES)
}

// sameMounts: pid sees the mounts this process sees, from the same root. Its ns/mnt
// link is closed to us as its exe is; its mountinfo is not, and mount ids are unique
// on the host, so another namespace's never reads the same.
func sameMounts(pid int32) bool {
	mine, err := readBounded("/proc/self/mountinfo")
	if err != nil {
		return false
	}
	theirs, err := readBounded("/proc/" + strconv.Itoa(int(pid)) + "/mountinfo")
	return err == nil && bytes.Equal(theirs, mine)
}

// readBounded reads at most 4 MiB of a file: what the sandbox shows is bounded.
func readBounded(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, 4<<20))
}

func procsServeMain(sid string) {
	checkSessionID(sid)
	listener, err := net.ListenUnix("unix", procsAddress(sid))
	if errors.Is(err, syscall.EADDRINUSE) {
		os.Exit(0) // another one serves
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "corral-exec:", err)
		os.Exit(1)
	}
	becomeManager()
	m := newManager("")
	for {
		conn, err := listener.AcceptUnix()
		if err != nil {
			time.Sleep(50 * time.Millisecond) // out of fds, say: the next may pass
			continue
		}
		if !clientAllowed(conn) {
			conn.Close()
			continue
		}
		c := newConn(m, conn, conn, func() { conn.Close() })
		go c.serve()
	}
}

// clientAllowed: a process of this sandbox running as our user or as root (anyone else
// in the network namespace, as a pod's other containers are, can reach the address).
func clientAllowed(conn *net.UnixConn) bool {
	cred, err := peerCred(conn)
	return err == nil && cred.Pid > 0 && (int(cred.Uid) == os.Getuid() || cred.Uid == 0) &&
		sameMounts(cred.Pid)
}
