package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

const (
	sysPidfdOpen = 434 // the same on amd64 and arm64
	fionread     = 0x541B
	// Read from one stream per round at most, so that a process writing without pause
	// still has its exit (and its other streams) noticed.
	roundLimit = 1 << 20
)

type procSpec struct {
	spec
	Pty      *winsize `json:"pty"`
	StatusFD bool     `json:"status_fd"`
	Name     string   `json:"name"`
	Buffer   int      `json:"buffer"`
	// Command is what the caller asked to run, as 'L' shows it, where argv wraps it
	// (the local provider's nsenter or unshare); empty: argv.
	Command []string `json:"command"`
}

type winsize struct {
	Rows int `json:"rows"`
	Cols int `json:"cols"`
}

type exitInfo struct {
	at     time.Time // zero while it runs (or its output is still being drained)
	code   *int
	signal *int
}

type proc struct {
	m            *manager
	n, pid       int
	uid, gid     int
	name, marker string
	argv         []string
	started      time.Time
	pty          bool
	stdin        *feeder // nil without stdin; with a pty, the terminal
	done         chan struct{}

	mu          sync.Mutex
	ring        ring
	subs        map[*sub]struct{}
	reaped      bool // its pid may belong to another process now: no more signals
	statusKnown bool
	status      syscall.WaitStatus
	killed      bool
	exit        exitInfo
}

func (m *manager) spawn(s *procSpec) (*proc, error) {
	u, env, path, err := prepare(s)
	if err != nil {
		return nil, err
	}
	st, err := openStreams(s, u)
	if err != nil {
		return nil, failf("other", "%v", err)
	}
	pid, err := m.fork(path, s, u, env, st)
	st.closeTheirs()
	if err != nil {
		st.abandon()
		return nil, err
	}
	p := &proc{
		m: m, pid: pid, uid: u.uid, gid: u.gid, name: s.Name, marker: s.Marker,
		argv: shownCommand(s), started: time.Now(), pty: st.pty,
		done: make(chan struct{}), subs: map[*sub]struct{}{},
	}
	p.ring.limit = bufferSize(s.Buffer)
	if err := st.watchExit(p); err != nil {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_, _ = syscall.Wait4(pid, nil, 0, nil)
		st.abandon()
		return nil, failf("other", "%v", err)
	}
	if st.input != nil {
		p.stdin = newFeeder(st.input)
		go p.stdin.run()
	}
	m.add(p)
	go p.pump(st)
	return p, nil
}

func prepare(s *procSpec) (execUser, []string, string, error) {
	if len(s.Argv) == 0 {
		return execUser{}, nil, "", failf("other", "argv is empty")
	}
	u, env, err := userEnv(s.spec)
	if err != nil {
		return u, nil, "", failf("user", "%v", err)
	}
	if s.Cwd != "" {
		if info, err := os.Stat(s.Cwd); err != nil {
			return u, nil, "", failf("cwd", "%v", err)
		} else if !info.IsDir() {
			return u, nil, "", failf("cwd", "%s: not a directory", s.Cwd)
		}
	}
	path, err := lookPath(s.Argv[0], env, s.Cwd)
	if err != nil {
		return u, nil, "", failf("program", "%v", err)
	}
	if _, ok := getenv(env, "TERM"); s.Pty != nil && !ok {
		env = append(env, "TERM=xterm-256color")
	}
	return u, env, path, nil
}

func (m *manager) fork(path string, s *procSpec, u execUser, env []string, st *streams) (int, error) {
	sys := &syscall.SysProcAttr{Setsid: true, Setctty: st.pty, Ctty: 0}
	argv, dir := s.Argv, s.Cwd
	if !s.AsSelf {
		// The user is switched by the trampoline, after it entered the cwd as the
		// manager: as an engine's exec and the local provider's do, so a cwd only the
		// manager may enter (the session's root on local) still works.
		argv = append([]string{self, "--as", strconv.Itoa(u.uid), strconv.Itoa(u.gid),
			joinGroups(u.groups), s.Cwd, path}, s.Argv...)
		path, dir = self, ""
	}
	attr := &syscall.ProcAttr{Dir: dir, Env: env, Files: st.child, Sys: sys}
	var pid int
	var err error
	if m.cgroup == "" {
		pid, err = syscall.ForkExec(path, argv, attr)
	} else {
		pid, err = forkExecInCgroup(m.cgroup, path, argv, attr)
	}
	if err == nil {
		return pid, nil
	}
	var refused *failure
	if errors.As(err, &refused) {
		return 0, err
	}
	switch err {
	case syscall.ENOENT, syscall.EACCES, syscall.ENOEXEC, syscall.ENOTDIR, syscall.EISDIR,
		syscall.ELOOP, syscall.ETXTBSY, syscall.ENAMETOOLONG:
		return 0, failf("program", "%s: %v", s.Argv[0], err)
	}
	return 0, failf("other", "%s: %v", s.Argv[0], err)
}

func bufferSize(n int) int {
	if n == 0 {
		n = 1 << 20
	}
	if n < 4<<10 {
		n = 4 << 10
	}
	if n > 64<<20 {
		n = 64 << 20
	}
	return n
}

type stream struct {
	fd   int // -1 once it ended
	kind byte
}

// streams are a process's file descriptors: the child's ends until it runs, ours
// (non-blocking, in one epoll set) until it is done.
type streams struct {
	ep     int
	epFile *os.File // ep in the runtime's poller: waiting for it holds no thread
	outs   []stream // stdout and stderr, or the terminal
	status int      // fd 3's read end, or -1
	exit   int      // readable once the leader has exited
	pty    bool
	input  *os.File // stdin's write end or the terminal; the feeder's
	child  []uintptr
	theirs []int
}

func openStreams(s *procSpec, u execUser) (st *streams, err error) {
	st = &streams{status: -1, exit: -1}
	defer func() {
		if err != nil {
			st.closeTheirs()
			st.abandon()
		}
	}()
	if st.ep, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); err != nil {
		st.ep = -1
		return st, err
	}
	if err = syscall.SetNonblock(st.ep, true); err != nil {
		return st, err
	}
	st.epFile = os.NewFile(uintptr(st.ep), "epoll")
	if s.Pty != nil {
		err = st.openPty(s.Pty, u.uid, !s.AsSelf)
	} else {
		err = st.openPipes(s.Stdin)
	}
	if err == nil && s.StatusFD {
		st.status, err = st.pipeOut()
	}
	return st, err
}

func (st *streams) give(fd int) {
	st.theirs = append(st.theirs, fd)
	st.child = append(st.child, uintptr(fd))
}

func (st *streams) openPipes(stdin bool) error {
	if stdin {
		var p [2]int
		if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
			return err
		}
		st.give(p[0])
		if err := syscall.SetNonblock(p[1], true); err != nil {
			syscall.Close(p[1])
			return err
		}
		st.input = os.NewFile(uintptr(p[1]), "stdin")
	} else {
		null, err := syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		st.give(null)
	}
	for _, kind := range []byte{'o', 'e'} {
		fd, err := st.pipeOut()
		if err != nil {
			return err
		}
		st.outs = append(st.outs, stream{fd, kind})
	}
	return nil
}

// pipeOut makes the child's next fd the write end of a pipe whose read end is ours.
func (st *streams) pipeOut() (int, error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return -1, err
	}
	st.give(p[1])
	if err := syscall.SetNonblock(p[0], true); err != nil {
		syscall.Close(p[0])
		return -1, err
	}
	if err := st.watch(p[0]); err != nil {
		syscall.Close(p[0])
		return -1, err
	}
	return p[0], nil
}

func (st *streams) openPty(size *winsize, uid int, chown bool) error {
	master, err := syscall.Open("/dev/ptmx", syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	st.outs = []stream{{master, 'o'}}
	var unlock int32
	var n uint32
	if err := ioctl(uintptr(master), syscall.TIOCSPTLCK, unsafe.Pointer(&unlock)); err != nil {
		return err
	}
	if err := ioctl(uintptr(master), syscall.TIOCGPTN, unsafe.Pointer(&n)); err != nil {
		return err
	}
	slave, err := syscall.Open("/dev/pts/"+strconv.Itoa(int(n)),
		syscall.O_RDWR|syscall.O_NOCTTY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	st.give(slave)
	st.child = append(st.child, uintptr(slave), uintptr(slave))
	st.pty = true
	if chown {
		_ = syscall.Fchown(slave, uid, -1) // what reopens its terminal by name may
	}
	if err := setSize(uintptr(master), size.Rows, size.Cols); err != nil {
		return err
	}
	if err := syscall.SetNonblock(master, true); err != nil {
		return err
	}
	// The feeder's own descriptor: writes wait in the runtime's poller, and ioctls on it
	// cannot meet a closed (or reused) number.
	dup, _, errno := syscall.Syscall(syscall.SYS_FCNTL, uintptr(master), syscall.F_DUPFD_CLOEXEC, 0)
	if errno != 0 {
		return errno
	}
	st.input = os.NewFile(dup, "pty")
	return st.watch(master)
}

var pidfdOpen = func(pid int) (int, error) {
	fd, _, errno := syscall.Syscall(sysPidfdOpen, uintptr(pid), 0, 0)
	if errno != 0 {
		return -1, errno
	}
	return int(fd), nil
}

func (st *streams) watchExit(p *proc) error {
	fd, err := pidfdOpen(p.pid)
	if err == nil {
		st.exit = fd
		return st.watch(fd)
	}
	// Before Linux 5.3: a thread waits for it, and closes a pipe once it has.
	var w [2]int
	if err := syscall.Pipe2(w[:], syscall.O_CLOEXEC); err != nil {
		return err
	}
	st.exit = w[0]
	if err := st.watch(w[0]); err != nil {
		syscall.Close(w[1])
		return err
	}
	go func() {
		var ws syscall.WaitStatus
		_, err := wait4(p.pid, &ws, 0)
		p.mu.Lock()
		p.reaped, p.statusKnown, p.status = true, err == nil, ws
		p.mu.Unlock()
		syscall.Close(w[1])
	}()
	return nil
}

func wait4(pid int, ws *syscall.WaitStatus, options int) (int, error) {
	for {
		wpid, err := syscall.Wait4(pid, ws, options, nil)
		if err != syscall.EINTR {
			return wpid, err
		}
	}
}

func (st *streams) watch(fd int) error {
	return syscall.EpollCtl(st.ep, syscall.EPOLL_CTL_ADD, fd,
		&syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(fd)})
}

func (st *streams) unwatch(fd *int) {
	_ = syscall.EpollCtl(st.ep, syscall.EPOLL_CTL_DEL, *fd, nil)
	syscall.Close(*fd)
	*fd = -1
}

func (st *streams) open() bool {
	for _, s := range st.outs {
		if s.fd >= 0 {
			return true
		}
	}
	return st.status >= 0
}

func (st *streams) closeTheirs() {
	seen := map[int]bool{}
	for _, fd := range st.theirs {
		if !seen[fd] {
			seen[fd] = true
			syscall.Close(fd)
		}
	}
	st.theirs = nil
}

// closeOurs closes what the pump reads; the input is the feeder's.
func (st *streams) closeOurs() {
	for i := range st.outs {
		if st.outs[i].fd >= 0 {
			st.unwatch(&st.outs[i].fd)
		}
	}
	for _, fd := range []*int{&st.status, &st.exit} {
		if *fd >= 0 {
			syscall.Close(*fd)
			*fd = -1
		}
	}
	if st.epFile != nil {
		st.epFile.Close()
	} else if st.ep >= 0 {
		syscall.Close(st.ep)
	}
	st.ep = -1
}

func (st *streams) abandon() {
	st.closeOurs()
	if st.input != nil {
		st.input.Close()
	}
}

// pump records the process's output and then its exit, in the order the ordering
// guarantee (procs.go) asks for.
func (p *proc) pump(st *streams) {
	buf := make([]byte, chunkSize)
	events := make([]syscall.EpollEvent, 8)
	var reapedAt time.Time
	for st.open() || reapedAt.IsZero() {
		var deadline time.Time
		if !reapedAt.IsZero() {
			deadline = reapedAt.Add(p.grace())
			if !time.Now().Before(deadline) {
				break
			}
			if tick := time.Now().Add(50 * time.Millisecond); tick.Before(deadline) {
				deadline = tick // a kill while draining shortens the grace
			}
		}
		n, err := st.wait(events, deadline)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		} else if err != nil {
			break
		}
		exited, status := false, false
		for _, ev := range events[:n] {
			exited = exited || int(ev.Fd) == st.exit
			status = status || int(ev.Fd) == st.status
		}
		st.drain(p, buf)
		if status {
			st.readStatus(p, buf)
		}
		if exited && p.reap() {
			st.unwatch(&st.exit)
			reapedAt = time.Now()
		}
	}
	st.closeOurs()
	p.finish()
}

// wait returns the ready events, parked in the runtime's poller until there are some.
func (st *streams) wait(events []syscall.EpollEvent, deadline time.Time) (int, error) {
	if err := st.epFile.SetReadDeadline(deadline); err != nil {
		return 0, err
	}
	rc, err := st.epFile.SyscallConn()
	if err != nil {
		return 0, err
	}
	n, werr := 0, error(nil)
	err = rc.Read(func(fd uintptr) bool {
		for {
			n, werr = syscall.EpollWait(int(fd), events, 0)
			if werr != syscall.EINTR {
				return n != 0 || werr != nil
			}
		}
	})
	if err == nil {
		err = werr
	}
	return n, err
}

func (p *proc) grace() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.killed {
		return drainAfterKill
	}
	return drainAfterExit
}

func (st *streams) drain(p *proc, buf []byte) {
	for i := range st.outs {
		st.readStream(p, i, buf, roundLimit)
	}
}

// readStream records what stream i holds, up to about limit bytes, and says how many.
func (st *streams) readStream(p *proc, i int, buf []byte, limit int) int {
	s := &st.outs[i]
	total := 0
	for s.fd >= 0 && total < limit {
		n, err := syscall.Read(s.fd, buf)
		if n > 0 {
			p.record(s.kind, buf[:n])
			total += n
			continue
		}
		if err == syscall.EINTR {
			continue
		}
		if err != syscall.EAGAIN {
			st.unwatch(&s.fd) // its end, or EIO: the terminal's other side is closed
		}
		break
	}
	return total
}

// readStatus records one read of the status pipe, after what the process wrote to its
// output before it: by now all of that is in the pipes, and FIONREAD says how much.
func (st *streams) readStatus(p *proc, buf []byte) {
	n, err := syscall.Read(st.status, buf)
	if n <= 0 {
		if err != syscall.EAGAIN && err != syscall.EINTR {
			st.unwatch(&st.status)
		}
		return
	}
	data := append([]byte(nil), buf[:n]...)
	for i, s := range st.outs {
		var pending int32
		if s.fd >= 0 && ioctl(uintptr(s.fd), fionread, unsafe.Pointer(&pending)) == nil && pending > 0 {
			st.readStream(p, i, buf, int(pending))
		}
	}
	// A terminal passes what was written to it on to our side from a kernel worker:
	// give that a moment.
	for round := 0; st.pty && round < 5; round++ {
		time.Sleep(time.Millisecond)
		if st.readStream(p, 0, buf, roundLimit) == 0 {
			break
		}
	}
	p.record('t', data)
}

func (p *proc) record(kind byte, data []byte) {
	p.mu.Lock()
	p.ring.add(kind, data)
	p.notify()
	p.mu.Unlock()
}

// notify (under p.mu) queues every subscription that now has something to send.
func (p *proc) notify() {
	for s := range p.subs {
		if s.wants() {
			s.c.markReady(s)
		}
	}
}

// reap collects the leader's status once its pidfd says it has exited.
func (p *proc) reap() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.reaped {
		var ws syscall.WaitStatus
		wpid, err := wait4(p.pid, &ws, syscall.WNOHANG)
		if wpid == 0 && err == nil {
			return false
		}
		p.reaped, p.statusKnown, p.status = true, err == nil, ws
	}
	return true
}

func (p *proc) finish() {
	if !p.reap() {
		var ws syscall.WaitStatus
		_, err := wait4(p.pid, &ws, 0)
		p.mu.Lock()
		p.reaped, p.statusKnown, p.status = true, err == nil, ws
		p.mu.Unlock()
	}
	if p.stdin != nil {
		p.stdin.shutdown()
	}
	p.mu.Lock()
	p.exit.at = time.Now()
	if p.statusKnown && p.status.Exited() {
		code := p.status.ExitStatus()
		p.exit.code = &code
	} else if p.statusKnown && p.status.Signaled() {
		sig := int(p.status.Signal())
		p.exit.signal = &sig
	}
	close(p.done)
	p.notify()
	p.mu.Unlock()
	p.m.retire(p)
}

// kill ends the whole tree, as the exec channel's kill does.
func (p *proc) kill() {
	p.mu.Lock()
	if !p.exit.at.IsZero() {
		p.mu.Unlock()
		return
	}
	p.killed = true
	if !p.reaped {
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
	}
	p.mu.Unlock()
	killMarkedAs(p.uid, p.gid, p.marker)
}

func (p *proc) signal(sig int, spareLeader bool) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.reaped {
		return failf("exited", "process %d has exited", p.n)
	}
	if spareLeader {
		return signalMembers(p.pid, syscall.Signal(sig))
	}
	group := int32(p.pid)
	if p.pty {
		var fg int32
		err := p.stdin.control(func(fd uintptr) error {
			return ioctl(fd, syscall.TIOCGPGRP, unsafe.Pointer(&fg))
		})
		if err == nil && fg > 0 {
			group = fg
		}
	}
	if err := syscall.Kill(-int(group), syscall.Signal(sig)); err != nil {
		return failf("other", "signal %d: %v", sig, err)
	}
	return nil
}

// signalMembers signals every process of the group but its leader.
func signalMembers(pgid int, sig syscall.Signal) error {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return failf("other", "%v", err)
	}
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		if err == nil && pid != pgid && processGroup(pid) == pgid {
			_ = syscall.Kill(pid, sig)
		}
	}
	return nil
}

func processGroup(pid int) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	// The command's name, in parentheses, may hold anything: count fields after it.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return -1
	}
	fields := strings.Fields(string(data[i+1:])) // state, ppid, pgrp, ...
	if len(fields) < 3 {
		return -1
	}
	pgrp, err := strconv.Atoi(fields[2])
	if err != nil {
		return -1
	}
	return pgrp
}

func (p *proc) resize(rows, cols int) error {
	if !p.pty {
		return failf("pty", "process %d has no terminal", p.n)
	}
	err := p.stdin.control(func(fd uintptr) error { return setSize(fd, rows, cols) })
	if err != nil {
		return failf("exited", "process %d: %v", p.n, err)
	}
	return nil
}

func setSize(fd uintptr, rows, cols int) error {
	ws := [4]uint16{uint16(rows), uint16(cols), 0, 0}
	return ioctl(fd, syscall.TIOCSWINSZ, unsafe.Pointer(&ws))
}

func ioctl(fd, req uintptr, arg unsafe.Pointer) error {
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, fd, req, uintptr(arg)); errno != 0 {
		return errno
	}
	return nil
}

func (p *proc) write(data []byte, done func(error)) {
	if p.stdin == nil {
		done(failf("stdin", "process %d has no stdin", p.n))
		return
	}
	p.stdin.push(feed{data: data, done: done})
}

func (p *proc) closeStdin(done func(error)) {
	if p.stdin == nil || p.pty {
		done(failf("stdin", "process %d has no stdin pipe", p.n))
		return
	}
	p.stdin.push(feed{close: true, done: func(error) { done(nil) }})
}

// feeder writes a process's stdin in order, so that one that does not read stalls only
// its own writes.
type feeder struct {
	file   *os.File
	mu     sync.Mutex
	cond   *sync.Cond
	queue  []feed
	closed bool // takes nothing more
}

type feed struct {
	data  []byte
	close bool
	done  func(error)
}

func newFeeder(file *os.File) *feeder {
	f := &feeder{file: file}
	f.cond = sync.NewCond(&f.mu)
	return f
}

func (f *feeder) push(x feed) {
	f.mu.Lock()
	if f.closed {
		f.mu.Unlock()
		x.done(failf("stdin", "stdin is closed"))
		return
	}
	f.closed = x.close
	f.queue = append(f.queue, x)
	f.mu.Unlock()
	f.cond.Signal()
}

func (f *feeder) pop() (feed, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for len(f.queue) == 0 && !f.closed {
		f.cond.Wait()
	}
	if len(f.queue) == 0 {
		return feed{}, false
	}
	x := f.queue[0]
	f.queue[0] = feed{}
	f.queue = f.queue[1:]
	return x, true
}

func (f *feeder) run() {
	var broken error
	for {
		x, ok := f.pop()
		if !ok {
			return
		}
		switch {
		case x.close:
			f.file.Close()
			x.done(nil)
		case broken != nil:
			x.done(broken)
		default:
			if _, err := f.file.Write(x.data); err != nil {
				broken = failf("stdin", "%v", err)
			}
			x.done(broken)
		}
	}
}

// shutdown: the process has exited; what is queued, or blocked on a grandchild that
// holds the pipe without reading, fails.
func (f *feeder) shutdown() {
	f.mu.Lock()
	f.closed = true
	f.mu.Unlock()
	f.cond.Broadcast()
	f.file.Close()
}

func (f *feeder) control(fn func(fd uintptr) error) error {
	rc, err := f.file.SyscallConn()
	if err != nil {
		return err
	}
	var inner error
	if err := rc.Control(func(fd uintptr) { inner = fn(fd) }); err != nil {
		return err
	}
	return inner
}

func shownCommand(s *procSpec) []string {
	if len(s.Command) > 0 {
		return s.Command
	}
	return s.Argv
}

func joinGroups(groups []uint32) string {
	parts := make([]string, len(groups))
	for i, g := range groups {
		parts[i] = strconv.FormatUint(uint64(g), 10)
	}
	return strings.Join(parts, ",")
}

// asMain is the trampoline of a start with a user switch: `--as UID GID GROUPS CWD PATH
// ARGV...`. It enters CWD as the manager's user, becomes the user, and execs PATH; the
// pid, session, terminal and descriptors the manager gave it stay the process's.
func asMain(args []string) {
	uid, err1 := strconv.Atoi(args[0])
	gid, err2 := strconv.Atoi(args[1])
	var groups []int
	for _, g := range strings.Split(args[2], ",") {
		if n, err := strconv.Atoi(g); err == nil {
			groups = append(groups, n)
		}
	}
	if err1 != nil || err2 != nil {
		fmt.Fprintln(os.Stderr, "corral-exec --as: bad user")
		os.Exit(126)
	}
	if args[3] != "" {
		if err := syscall.Chdir(args[3]); err != nil {
			fmt.Fprintf(os.Stderr, "corral-exec: %s: %v\n", args[3], err)
			os.Exit(126)
		}
	}
	for _, step := range []func() error{
		func() error { return syscall.Setgroups(groups) },
		func() error { return syscall.Setgid(gid) },
		func() error { return syscall.Setuid(uid) },
	} {
		if err := step(); err != nil {
			fmt.Fprintf(os.Stderr, "corral-exec: becoming %d:%d: %v\n", uid, gid, err)
			os.Exit(126)
		}
	}
	err := syscall.Exec(args[4], args[5:], os.Environ())
	fmt.Fprintf(os.Stderr, "corral-exec: %s: %v\n", args[5], err)
	os.Exit(127)
}
