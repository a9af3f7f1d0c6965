// corral-exec: the exec channel's helper, started once per sandbox over one long-lived
// exec stream (on Docker a `docker exec` as root; on Kubernetes a websocket exec through
// the API server, as the container's user). It spawns each command it is asked for with
// the same semantics as a plain exec (argv, cwd, env, user, stdin, exit code, stdout and
// stderr apart) and streams the output back, several commands at once, multiplexed by id.
//
// Nothing corral decides depends on this program: it only carries the workload's own
// commands and their output, which the workload controls anyway. Anything it cannot do
// exactly as the engine would (an unknown user, a missing cwd or program, no capability
// to switch users) is answered with a refusal, and corral runs that call as a plain exec.
//
// Frames, both ways (see src/corral/helper/channel.py):
//
//	u32 length (big-endian) of what follows | u8 kind | u32 id | payload
//
// corral -> helper: 'R' run (JSON spec), 'I' stdin bytes, 'C' end of stdin, 'K' kill.
// helper -> corral: 'H' hello (JSON, id 0), 'o' stdout bytes, 'e' stderr bytes,
// 'X' exit (JSON), 'F' refused before anything ran (text).
//
// The --procs modes (the session's process manager) are described in procs.go.
package main

import (
	_ "corral.local/exechelper/nodump" // before main's own init: see its doc

	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	version   = 1
	maxFrame  = 16 << 20
	chunkSize = 32 << 10
	marker    = "CORRAL_EXEC"
	// After the command exits, output still held open by what it left behind is read
	// for this long, as the engine does for a plain exec.
	drainAfterExit = 2 * time.Second
	drainAfterKill = 200 * time.Millisecond
)

type spec struct {
	Argv   []string `json:"argv"`
	Cwd    string   `json:"cwd"`
	Env    []string `json:"env"`
	User   string   `json:"user"`
	Stdin  bool     `json:"stdin"`
	Marker string   `json:"marker"`
	// AsSelf: run as the helper's own user, groups and environment (no switch), where the
	// API the helper was started through cannot switch users either (Kubernetes).
	AsSelf bool `json:"as_self"`
}

type writer struct {
	mu  sync.Mutex
	out io.Writer
}

func encodeFrame(kind byte, id uint32, payload []byte) []byte {
	buf := make([]byte, 9+len(payload))
	copy(buf[9:], payload)
	putHeader(buf, kind, id)
	return buf
}

// putHeader fills in the first 9 bytes of buf, a frame whose payload follows them.
func putHeader(buf []byte, kind byte, id uint32) {
	binary.BigEndian.PutUint32(buf[0:4], uint32(len(buf)-4))
	buf[4] = kind
	binary.BigEndian.PutUint32(buf[5:9], id)
}

var errBadFrame = errors.New("bad frame")

// readFrame reads one frame; a size outside the protocol's is an error, since what
// follows it cannot be trusted to be framed either.
func readFrame(in *bufio.Reader) (kind byte, id uint32, payload []byte, err error) {
	var header [9]byte
	if _, err = io.ReadFull(in, header[:]); err != nil {
		return 0, 0, nil, err
	}
	size := binary.BigEndian.Uint32(header[0:4])
	if size < 5 || size > maxFrame {
		return 0, 0, nil, errBadFrame
	}
	payload = make([]byte, size-5)
	if _, err = io.ReadFull(in, payload); err != nil {
		return 0, 0, nil, err
	}
	return header[4], binary.BigEndian.Uint32(header[5:9]), payload, nil
}

func (w *writer) frame(kind byte, id uint32, payload []byte) {
	buf := encodeFrame(kind, id, payload)
	w.mu.Lock()
	defer w.mu.Unlock()
	if _, err := w.out.Write(buf); err != nil {
		// corral is gone: nothing can reach it any more.
		killAll()
		os.Exit(0)
	}
}

// inbox holds a command's stdin until the command reads it, so that a command which
// never reads cannot stall the channel.
type inbox struct {
	mu     sync.Mutex
	cond   *sync.Cond
	chunks [][]byte
	closed bool
}

func newInbox() *inbox {
	b := &inbox{}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *inbox) push(chunk []byte) {
	b.mu.Lock()
	if !b.closed {
		b.chunks = append(b.chunks, chunk)
	}
	b.mu.Unlock()
	b.cond.Signal()
}

func (b *inbox) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cond.Signal()
}

func (b *inbox) pop() ([]byte, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.chunks) == 0 && !b.closed {
		b.cond.Wait()
	}
	if len(b.chunks) == 0 {
		return nil, false
	}
	chunk := b.chunks[0]
	b.chunks = b.chunks[1:]
	return chunk, true
}

func (b *inbox) feed(f *os.File) {
	broken := false
	for {
		chunk, ok := b.pop()
		if !ok {
			break
		}
		if !broken {
			if _, err := f.Write(chunk); err != nil {
				broken = true // the command closed its stdin: the rest is dropped
			}
		}
	}
	f.Close()
}

type job struct {
	id      uint32
	pid     int
	uid     int
	gid     int
	marker  string
	stdin   *inbox
	mu      sync.Mutex
	killed  bool
	done    chan struct{}
	readers []*os.File
}

var (
	out   = &writer{out: os.Stdout}
	jobs  = map[uint32]*job{}
	jobMu sync.Mutex
	self  string
	// HOME came from the container's config: it is kept; otherwise it is the user's.
	homeFromConfig bool
)

func main() {
	if len(os.Args) >= 4 && os.Args[1] == "--nflog" {
		nflogMain(os.Args[2], os.Args[3])
		return
	}
	if len(os.Args) >= 3 && os.Args[1] == "--dns" {
		dnsMain(os.Args[2])
		return
	}
	if len(os.Args) >= 4 && os.Args[1] == "--dns-query" {
		dnsQueryMain(os.Args[2], os.Args[3])
		return
	}
	if len(os.Args) >= 3 && os.Args[1] == "--kill" {
		killMarked(os.Args[2])
		return
	}
	if len(os.Args) >= 5 && os.Args[1] == "--probe-dial" {
		probeDialMain(os.Args[2:])
		return
	}
	if len(os.Args) >= 8 && os.Args[1] == "--as" {
		asMain(os.Args[2:])
		return
	}
	if len(os.Args) >= 2 && os.Args[1] == "--procs-stdio" {
		cgroup := ""
		if len(os.Args) >= 3 {
			cgroup = os.Args[2]
		}
		procsStdioMain(cgroup)
		return
	}
	if len(os.Args) >= 3 && os.Args[1] == "--file-size" {
		fileSizeMain(os.Args[2])
		return
	}
	if len(os.Args) >= 5 && os.Args[1] == "--file-range" {
		fileRangeMain(os.Args[2], os.Args[3], os.Args[4])
		return
	}
	if len(os.Args) >= 3 && os.Args[1] == "--procs" {
		procsRelayMain(os.Args[2])
		return
	}
	if len(os.Args) >= 3 && os.Args[1] == "--procs-serve" {
		procsServeMain(os.Args[2])
		return
	}
	if len(os.Args) < 3 {
		fmt.Fprintln(os.Stderr, "usage: corral-exec SELF-PATH HOME-FROM-CONFIG(0|1)")
		os.Exit(2)
	}
	// The copy corral put in the sandbox is removed at once: the running program needs no
	// path, and nothing is left behind in the sandbox's filesystem (or a snapshot of it).
	_ = os.Remove(os.Args[1])
	self = "/proc/self/exe"
	homeFromConfig = os.Args[2] == "1"
	// A write to a closed stdout returns EPIPE instead of killing the helper (and a
	// handled signal, unlike an ignored one, is reset to default in the commands).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)

	hello, _ := json.Marshal(map[string]any{
		"version": version, "uid": os.Getuid(), "pid": os.Getpid(),
		"can_switch_user": canSwitchUser(),
	})
	out.frame('H', 0, hello)

	in := bufio.NewReaderSize(os.Stdin, 256<<10)
	for {
		kind, id, payload, err := readFrame(in)
		if err != nil {
			break
		}
		switch kind {
		case 'R':
			start(id, payload)
		case 'I':
			if j := lookup(id); j != nil && j.stdin != nil {
				j.stdin.push(payload)
			}
		case 'C':
			if j := lookup(id); j != nil && j.stdin != nil {
				j.stdin.close()
			}
		case 'K':
			if j := lookup(id); j != nil {
				go j.kill()
			} else {
				// Never started (its run was cancelled before it was sent) or already
				// reported: nothing to kill, and corral need not wait to hear so.
				refuse(id, fmt.Errorf("no such command"))
			}
		}
	}
	// corral closed the channel (or spoke nonsense): what it started goes with it.
	killAll()
}

func lookup(id uint32) *job {
	jobMu.Lock()
	defer jobMu.Unlock()
	return jobs[id]
}

func killAll() {
	jobMu.Lock()
	all := make([]*job, 0, len(jobs))
	for _, j := range jobs {
		all = append(all, j)
	}
	jobMu.Unlock()
	var wg sync.WaitGroup
	for _, j := range all {
		wg.Add(1)
		go func(j *job) { defer wg.Done(); j.kill() }(j)
	}
	wg.Wait()
}

func canSwitchUser() bool {
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "CapEff:") {
			caps, err := strconv.ParseUint(strings.TrimSpace(line[7:]), 16, 64)
			if err != nil {
				return false
			}
			const setgid, setuid = 1 << 6, 1 << 7
			return caps&setgid != 0 && caps&setuid != 0
		}
	}
	return false
}

func refuse(id uint32, err error) {
	out.frame('F', id, []byte(err.Error()))
}

func start(id uint32, payload []byte) {
	var s spec
	if err := json.Unmarshal(payload, &s); err != nil || len(s.Argv) == 0 {
		refuse(id, fmt.Errorf("bad request"))
		return
	}
	u, env, err := userEnv(s)
	if err != nil {
		refuse(id, err)
		return
	}
	path, err := lookPath(s.Argv[0], env, s.Cwd)
	if err != nil {
		refuse(id, err)
		return
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		refuse(id, err)
		return
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		refuse(id, err)
		return
	}
	cmd := &exec.Cmd{
		Path:   path,
		Args:   s.Argv,
		Env:    env,
		Dir:    s.Cwd,
		Stdout: outW,
		Stderr: errW,
		SysProcAttr: &syscall.SysProcAttr{
			Setsid: true, // its own session and process group: killed as one
		},
	}
	if !s.AsSelf {
		cmd.SysProcAttr.Credential = &syscall.Credential{
			Uid: uint32(u.uid), Gid: uint32(u.gid), Groups: u.groups,
		}
	}
	var inW *os.File
	if s.Stdin {
		var inR *os.File
		inR, inW, err = os.Pipe()
		if err != nil {
			outR.Close()
			outW.Close()
			errR.Close()
			errW.Close()
			refuse(id, err)
			return
		}
		cmd.Stdin = inR
		defer inR.Close()
	}
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		if inW != nil {
			inW.Close()
		}
		refuse(id, err)
		return
	}
	j := &job{
		id: id, pid: cmd.Process.Pid, uid: u.uid, gid: u.gid, marker: s.Marker,
		done: make(chan struct{}), readers: []*os.File{outR, errR},
	}
	if inW != nil {
		j.stdin = newInbox()
		go j.stdin.feed(inW)
	}
	jobMu.Lock()
	jobs[id] = j
	jobMu.Unlock()
	go j.wait(cmd)
}

// userEnv is the user a spec runs as and the environment it gets, as the engine sets them.
func userEnv(s spec) (execUser, []string, error) {
	if s.AsSelf {
		return execUser{uid: os.Getuid(), gid: os.Getgid()}, mergeEnv(os.Environ(), s.Env), nil
	}
	u, err := resolveUser(s.User)
	if err != nil {
		return u, nil, err
	}
	env := mergeEnv(baseEnv(), s.Env)
	if _, ok := getenv(env, "HOME"); !ok {
		env = append(env, "HOME="+u.home)
	}
	return u, env, nil
}

func (j *job) wait(cmd *exec.Cmd) {
	var pumps sync.WaitGroup
	for i, r := range j.readers {
		kind := byte('o')
		if i == 1 {
			kind = 'e'
		}
		pumps.Add(1)
		go func(r *os.File, kind byte) {
			defer pumps.Done()
			buf := make([]byte, chunkSize)
			for {
				n, err := r.Read(buf)
				if n > 0 {
					out.frame(kind, j.id, buf[:n])
				}
				if err != nil {
					return
				}
			}
		}(r, kind)
	}
	_ = cmd.Wait()
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	j.mu.Lock()
	grace := drainAfterExit
	if j.killed {
		grace = drainAfterKill
	}
	j.mu.Unlock()
	select {
	case <-drained:
	case <-time.After(grace):
		for _, r := range j.readers {
			r.Close() // unblocks the pump
		}
		<-drained
	}
	for _, r := range j.readers {
		r.Close()
	}
	if j.stdin != nil {
		j.stdin.close()
	}
	status, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	code := status.ExitStatus()
	if status.Signaled() {
		code = 128 + int(status.Signal())
	}
	j.mu.Lock()
	killed := j.killed
	j.mu.Unlock()
	jobMu.Lock()
	delete(jobs, j.id)
	jobMu.Unlock()
	result, _ := json.Marshal(map[string]any{"code": code, "killed": killed})
	out.frame('X', j.id, result)
	close(j.done)
}

// kill ends the command's whole tree: its process group, then every process that still
// carries its marker (whatever setsid'd or double-forked away), found the way a plain
// exec's kill is, as the command's own user.
func (j *job) kill() {
	select {
	case <-j.done:
		return // reaped: its pid may belong to another process by now
	default:
	}
	j.mu.Lock()
	j.killed = true
	j.mu.Unlock()
	_ = syscall.Kill(-j.pid, syscall.SIGKILL)
	_ = syscall.Kill(j.pid, syscall.SIGKILL)
	killMarkedAs(j.uid, j.gid, j.marker)
}

// killMarkedAs runs killMarked as the user whose processes carry the marker.
func killMarkedAs(uid, gid int, value string) {
	if value == "" {
		return
	}
	if uid == os.Getuid() {
		killMarked(value)
		return
	}
	// Root in the sandbox lacks CAP_SYS_PTRACE: another user's environ is read as that user.
	cmd := exec.Command(self, "--kill", value)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)},
	}
	_ = cmd.Run()
}

func killMarked(value string) {
	want := []byte(marker + "=" + value)
	me := os.Getpid()
	for round := 0; round < 5; round++ {
		found := 0
		entries, _ := os.ReadDir("/proc")
		for _, entry := range entries {
			pid, err := strconv.Atoi(entry.Name())
			if err != nil || pid == me {
				continue
			}
			data, err := os.ReadFile("/proc/" + entry.Name() + "/environ")
			if err != nil {
				continue
			}
			for _, kv := range strings.Split(string(data), "\x00") {
				if kv == string(want) {
					_ = syscall.Kill(pid, syscall.SIGKILL)
					found++
					break
				}
			}
		}
		if found == 0 {
			return
		}
	}
}

// baseEnv is the environment the engine gave this exec (the container's), less a HOME
// that the runtime added for root: each command gets its own user's.
func baseEnv() []string {
	env := os.Environ()
	if homeFromConfig {
		return env
	}
	kept := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "HOME=") {
			kept = append(kept, kv)
		}
	}
	return kept
}

func mergeEnv(base, extra []string) []string {
	merged := append([]string(nil), base...)
	for _, kv := range extra {
		key, _, _ := strings.Cut(kv, "=")
		replaced := false
		for i, old := range merged {
			if k, _, _ := strings.Cut(old, "="); k == key {
				merged[i] = kv
				replaced = true
				break
			}
		}
		if !replaced {
			merged = append(merged, kv)
		}
	}
	return merged
}

func getenv(env []string, key string) (string, bool) {
	for _, kv := range env {
		if k, v, _ := strings.Cut(kv, "="); k == key {
			return v, true
		}
	}
	return "", false
}

// lookPath finds a bare program name on the command's own PATH, as the runtime does.
func lookPath(name string, env []string, cwd string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path, _ := getenv(env, "PATH")
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		candidate := filepath.Join(dir, name)
		check := candidate
		if !filepath.IsAbs(check) && cwd != "" {
			check = filepath.Join(cwd, check)
		}
		info, err := os.Stat(check)
		if err == nil && info.Mode().IsRegular() && info.Mode().Perm()&0o111 != 0 {
			if !strings.Contains(candidate, "/") {
				candidate = "./" + candidate
			}
			return candidate, nil
		}
	}
	return "", fmt.Errorf("exec: %q: executable file not found in $PATH", name)
}

type execUser struct {
	uid, gid int
	groups   []uint32
	home     string
}

// resolveUser reads a user spec (name, uid, name:group, uid:gid) against the sandbox's
// /etc/passwd and /etc/group the way the engine's runtime does (runc's GetExecUser),
// with the primary group among the supplementary ones, as the engine sets them.
func resolveUser(spec string) (execUser, error) {
	if spec == "" {
		spec = "0"
	}
	userArg, groupArg, _ := strings.Cut(spec, ":")
	u := execUser{uid: 0, gid: 0, home: "/"}
	uidArg, uidErr := strconv.Atoi(userArg)
	matched := ""
	for _, f := range readEntries("/etc/passwd", 7) {
		uid, err1 := strconv.Atoi(f[2])
		gid, err2 := strconv.Atoi(f[3])
		if err1 != nil || err2 != nil {
			continue
		}
		if (uidErr == nil && uid == uidArg) || (uidErr != nil && f[0] == userArg) {
			matched, u.uid, u.gid, u.home = f[0], uid, gid, f[5]
			break
		}
	}
	if matched == "" {
		if uidErr != nil {
			return u, fmt.Errorf("unable to find user %s", userArg)
		}
		if uidArg < 0 {
			return u, errors.New("uid out of range")
		}
		u.uid = uidArg
	}
	var sgids []int
	if groupArg != "" || matched != "" {
		gidArg, gidErr := strconv.Atoi(groupArg)
		found := false
		for _, f := range readEntries("/etc/group", 4) {
			gid, err := strconv.Atoi(f[2])
			if err != nil {
				continue
			}
			if groupArg == "" {
				for _, member := range strings.Split(f[3], ",") {
					if member == matched {
						sgids = append(sgids, gid)
						break
					}
				}
			} else if !found && ((gidErr == nil && gid == gidArg) || (gidErr != nil && f[0] == groupArg)) {
				u.gid = gid
				found = true
			}
		}
		if groupArg != "" && !found {
			if gidErr != nil {
				return u, fmt.Errorf("unable to find group %s", groupArg)
			}
			if gidArg < 0 {
				return u, errors.New("gid out of range")
			}
			u.gid = gidArg
		}
	}
	seen := map[int]bool{}
	for _, g := range append([]int{u.gid}, sgids...) {
		if !seen[g] {
			seen[g] = true
			u.groups = append(u.groups, uint32(g))
		}
	}
	return u, nil
}

func readEntries(path string, fields int) [][]string {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var entries [][]string
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Split(line, ":")
		if len(f) < fields {
			f = append(f, make([]string, fields-len(f))...)
		}
		entries = append(entries, f)
	}
	return entries
}
