// The process manager: background processes owned by a corral session, with stdin,
// signals, terminals, output kept in bounded buffers here (not in the harness), exit
// status kept until read, several harness connections, and flow control so that the
// harness never buffers without bound. The workload is an adversary; this program is
// corral's own, run from a read-only location.
//
// # Modes
//
//	corral-exec --procs-stdio [CGROUP_DIR]
//
// Serves one client on stdin/stdout (the local provider: the manager is a child of the
// harness). When stdin ends (or the client breaks the protocol) every managed process's
// whole tree is killed and the manager exits 0. With CGROUP_DIR, every process is
// created inside that cgroup v2 directory (clone3 CLONE_INTO_CGROUP), so nothing it
// runs ever starts outside it (with Go before 1.20: see procs_cgroup_go119.go); if that
// fails the start is refused.
//
//	corral-exec --procs SID          (SID: ^[a-z0-9][a-z0-9-]{0,62}$, else exit 2)
//
// A relay, one per harness connection (Docker, Kubernetes: one exec stream each). It
// connects to the abstract unix socket "\x00corral-procs-"+SID, starting the daemon
// (below, detached) if nothing listens, and waits up to 5 s for it. The peer must be
// this same program (SO_PEERCRED: same uid, pid visible in our PID namespace, same
// /proc/<pid>/exe and mount namespace): otherwise one frame 'F', id 0, with a one-line
// reason is written to stdout and the relay exits 1, since a non-root workload may
// squat the address. Then bytes are copied both ways, uninterpreted, until either side
// ends; exit 0.
//
//	corral-exec --procs-serve SID
//
// The daemon: listens on that address (already taken: exit 0, another one serves).
// A connection is served only if its peer is in our PID and mount namespaces and runs
// as our uid or root. Connections are served as in stdio mode, except that the end of
// one only ends its subscriptions: processes outlive it. The daemon lives until killed.
//
// # Frames
//
// Both ways: u32 length (big-endian, counts kind+id+payload) | u8 kind | u32 id |
// payload. Payloads are JSON unless said otherwise. A frame under 5 or over 16 MiB,
// or bad JSON, ends the connection (stdio mode: kill everything and exit).
//
// On connecting the client receives 'H', id 0: {"version": 2, "epoch": "<16 hex
// chars, new per manager instance>", "pid": <manager pid>, "uid": <uid>,
// "can_switch_user": <bool>}.
//
// Requests carry an id the client picks (unique per connection, non-zero); the reply
// has the same id. 'Y' means done; a 'Y' without a documented payload carries {}.
// 'F' is {"kind": ..., "message": ...}; the kind "proc" means no such process, "other"
// anything without a kind of its own (an unknown request among them). Replies wait in
// a queue of 4096 frames: a client that lets it fill is disconnected.
//
// 'S' start: {"argv": [...], "cwd": "", "env": ["K=V"], "user": "", "as_self": bool,
// "stdin": bool, "pty": null | {"rows": r, "cols": c}, "status_fd": bool, "name": "",
// "marker": "", "buffer": n}. User, environment and program lookup as the exec
// channel's 'R' (main.go), HOME from the user's passwd entry unless "env" sets it (or
// as_self); cwd "" is the manager's own. The daemon's cwd is /, its environment the
// first relay's. Replies 'Y' {"proc": n, "pid": pid} once it runs, or 'F' with kind
// "user", "cwd", "program" or "other". Process numbers count 1, 2, 3... per manager
// instance and are never reused. Each process is a session and process group leader.
// "marker" is what 'K' looks for in environs as CORRAL_EXEC=<marker>: the client puts
// that in "env" itself. Without a pty stdin is a pipe ("stdin") or /dev/null, and
// stdout ('o') and stderr ('e') are pipes; with a pty all three are the terminal
// (TERM=xterm-256color unless set), whose output is 'o'. "status_fd" gives the child
// an extra pipe as fd 3, a stream of its own ('t'). "buffer" is how many bytes of
// output are kept (0: 1 MiB; clamped to 4 KiB..64 MiB): one sequence across streams,
// oldest dropped first, offsets counted from the start.
//
// Ordering: status bytes are recorded only after everything the process had written
// to stdout and stderr before them (a persistent shell's status after its command's
// output), and the exit only after the output is drained: once the process exits its
// output is read until every writer closed it, for at most 2 s (grandchildren may
// hold it open; 200 ms after a 'K'). With a pty, output written just before a status
// write is waited for a few milliseconds (the kernel passes it on from a worker): best
// effort.
//
// 'A' attach: {"proc": n, "offset": o, "window": w}. Replies, on its id: 'B'
// {"offset": o2, "dropped": d} with o2 = max(o, oldest kept), d = o2 - o; then the
// output as raw 'o', 'e', 't' frames (each at most 32 KiB) in order, never more bytes
// in all than the window granted (w plus later 'W'); then, once the process has exited
// and all was sent, 'X' {"code": int|null, "signal": int|null, "dropped": total lost}
// and the subscription ends ("dropped" includes the first 'B' gap). Output dropped
// before it was sent is announced by another 'B' {"offset": next, "dropped": gap}
// where the output resumes, only once the window is open again: a client that takes
// nothing is sent nothing. o beyond the end waits for the output to reach it.
// Subscriptions are independent of each other: a client that does not read stalls only
// its own, and output is only ever held in its process's buffer, never per client.
//
// 'W' grant: id of an attach, {"bytes": n}; no reply.
// 'D' detach: id of an attach; 'Y' after which nothing more comes on that id.
// 'I' stdin: payload u32 proc (big-endian) + raw bytes (to the terminal, with a pty);
// 'Y' once all are written, 'F' kind "stdin" if the process has no (more) stdin, has
// exited, or the write fails. Writes to one process are done in order without stalling
// anything else; what is left when it exits fails.
// 'C' close stdin: {"proc": n}; 'Y' after the writes before it (also if it was closed
// already); 'F' kind "stdin" for a pty or a process without stdin.
// 'G' signal: {"proc": n, "signal": s, "spare_leader": bool}: to the process group
// (with a pty: the terminal's foreground group); with spare_leader to every member of
// the process group but its leader (a persistent shell's stuck command). 'Y', or 'F'
// kind "exited" once the leader is reaped (its pid, and group, may be another's).
// 'K' kill: {"proc": n}: the whole tree (process group, then what carries the marker;
// only the marker once the leader is reaped); 'Y' once the exit is recorded (at once
// if it was).
// 'Z' resize: {"proc": n, "rows": r, "cols": c}; 'Y', or 'F' kind "pty" (no pty) or
// "exited".
// 'L' list: {}; 'Y' [{"proc", "pid", "name", "argv" (the start's "command" where it
// gave one), "started_at" (unix seconds),
// "running", "code", "signal"}...]: the running processes and the last 256 exited.
// Older exited ones are forgotten, buffers and all.
package main

import (
	"bufio"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"sync"
	"syscall"
)

const (
	procsVersion = 2
	keepExited   = 256
	// Replies waiting to be written: only a client that stops reading them fills this.
	ctrlQueue = 4096
)

type manager struct {
	hello  []byte
	cgroup string
	mu     sync.Mutex
	procs  map[int]*proc
	exited []int // in order of exit, for forgetting the oldest
	last   int
}

func newManager(cgroup string) *manager {
	var epoch [8]byte
	_, _ = rand.Read(epoch[:])
	hello, _ := json.Marshal(map[string]any{
		"version": procsVersion, "epoch": hex.EncodeToString(epoch[:]),
		"pid": os.Getpid(), "uid": os.Getuid(), "can_switch_user": canSwitchUser(),
	})
	return &manager{hello: hello, cgroup: cgroup, procs: map[int]*proc{}}
}

// becomeManager sets up this program to start processes: they inherit no more than
// they are given.
func becomeManager() {
	self = "/proc/self/exe"
	closeOnExecAll()
	// Handled, not ignored (as an inherited SIG_IGN of these would stay): the processes
	// get the default dispositions. A write to a closed peer returns EPIPE.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE, syscall.SIGINT, syscall.SIGHUP)
}

// closeOnExecAll keeps what this program inherited (beyond stdio) from what it starts.
func closeOnExecAll() {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, entry := range entries {
		if fd, err := strconv.Atoi(entry.Name()); err == nil && fd > 2 {
			syscall.CloseOnExec(fd)
		}
	}
}

func procsStdioMain(cgroup string) {
	becomeManager()
	m := newManager(cgroup)
	// The harness's ^C is its to handle (it then closes stdin); a polite end of the
	// manager takes its processes with it, as the end of stdin does.
	ends := make(chan os.Signal, 1)
	signal.Notify(ends, syscall.SIGTERM, syscall.SIGHUP)
	go func() { <-ends; m.killAll(); os.Exit(0) }()
	c := newConn(m, os.Stdin, os.Stdout, func() { m.killAll(); os.Exit(0) })
	c.serve()
}

func (m *manager) get(n int) *proc {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.procs[n]
}

func (m *manager) add(p *proc) {
	m.mu.Lock()
	m.last++
	p.n = m.last
	m.procs[p.n] = p
	m.mu.Unlock()
}

// retire keeps the exited process until keepExited others have exited after it.
func (m *manager) retire(p *proc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.exited = append(m.exited, p.n)
	if len(m.exited) > keepExited {
		delete(m.procs, m.exited[0])
		m.exited = m.exited[1:]
	}
}

func (m *manager) all() []*proc {
	m.mu.Lock()
	all := make([]*proc, 0, len(m.procs))
	for _, p := range m.procs {
		all = append(all, p)
	}
	m.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].n < all[j].n })
	return all
}

func (m *manager) killAll() {
	var wg sync.WaitGroup
	for _, p := range m.all() {
		wg.Add(1)
		go func(p *proc) { defer wg.Done(); p.kill() }(p)
	}
	wg.Wait()
}

// failure is a refusal the client can tell apart by kind.
type failure struct {
	Kind    string `json:"kind"`
	Message string `json:"message"`
}

func (f *failure) Error() string { return f.Message }

func failf(kind, format string, args ...any) error {
	return &failure{Kind: kind, Message: fmt.Sprintf(format, args...)}
}

// request is every small JSON request, each using its own fields.
type request struct {
	Proc        int   `json:"proc"`
	Offset      int64 `json:"offset"`
	Window      int64 `json:"window"`
	Bytes       int64 `json:"bytes"`
	Signal      int   `json:"signal"`
	SpareLeader bool  `json:"spare_leader"`
	Rows        int   `json:"rows"`
	Cols        int   `json:"cols"`
}

// conn is one client. Its frames are written by one goroutine: replies from a bounded
// queue, output pulled from the processes' buffers only as fast as the client takes it,
// so nothing here grows with what the client has not read.
type conn struct {
	m     *manager
	in    *bufio.Reader
	out   io.Writer
	onEnd func()
	ctrl  chan []byte
	wake  chan struct{}
	done  chan struct{}
	once  sync.Once

	mu     sync.Mutex
	closed bool
	ready  []*sub // subscriptions with something to send, in turn
	subs   map[uint32]*sub
}

func newConn(m *manager, in io.Reader, out io.Writer, onEnd func()) *conn {
	return &conn{
		m: m, in: bufio.NewReaderSize(in, 256<<10), out: out, onEnd: onEnd,
		ctrl: make(chan []byte, ctrlQueue), wake: make(chan struct{}, 1),
		done: make(chan struct{}), subs: map[uint32]*sub{},
	}
}

func (c *conn) serve() {
	c.send('H', 0, c.m.hello)
	go c.writeLoop()
	for {
		kind, id, payload, err := readFrame(c.in)
		if err != nil || c.handle(kind, id, payload) != nil {
			break
		}
	}
	c.close()
}

func (c *conn) close() {
	c.once.Do(func() {
		c.mu.Lock()
		c.closed = true
		subs := c.subs
		c.subs, c.ready = nil, nil
		c.mu.Unlock()
		close(c.done)
		for _, s := range subs {
			s.end()
		}
		c.onEnd()
	})
}

func (c *conn) send(kind byte, id uint32, payload []byte) { c.queue(encodeFrame(kind, id, payload)) }

func (c *conn) sendJSON(kind byte, id uint32, v any) { c.queue(jsonFrame(kind, id, v)) }

func (c *conn) queue(frame []byte) {
	select {
	case <-c.done:
	case c.ctrl <- frame:
	default:
		go c.close() // it does not read what it asks for
	}
}

// answer replies 'Y' {} or 'F' with the failure's kind.
func (c *conn) answer(id uint32, err error) {
	if err == nil {
		c.send('Y', id, []byte("{}"))
		return
	}
	f, ok := err.(*failure)
	if !ok {
		f = &failure{Kind: "other", Message: err.Error()}
	}
	c.sendJSON('F', id, f)
}

func (c *conn) writeLoop() {
	buf := make([]byte, 9+chunkSize)
	for {
		var frame []byte
		select {
		case frame = <-c.ctrl:
		case <-c.done:
			return
		default:
			if s := c.popReady(); s != nil {
				frame = s.frame(buf)
			} else {
				select {
				case frame = <-c.ctrl:
				case <-c.wake:
				case <-c.done:
					return
				}
			}
		}
		if frame == nil {
			continue
		}
		if _, err := c.out.Write(frame); err != nil {
			c.close()
			return
		}
	}
}

func (c *conn) markReady(s *sub) {
	c.mu.Lock()
	if !s.queued && !c.closed {
		s.queued = true
		c.ready = append(c.ready, s)
	}
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *conn) popReady() *sub {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.ready) == 0 {
		return nil
	}
	s := c.ready[0]
	c.ready[0] = nil
	c.ready = c.ready[1:]
	s.queued = false
	return s
}

func (c *conn) handle(kind byte, id uint32, payload []byte) error {
	switch kind {
	case 'I':
		return c.stdin(id, payload)
	case 'D':
		c.detach(id)
		return nil
	case 'S':
		var s procSpec
		if err := json.Unmarshal(payload, &s); err != nil {
			return err
		}
		c.start(id, &s)
		return nil
	case 'L':
		if len(payload) > 0 && !json.Valid(payload) {
			return errBadFrame
		}
		c.sendJSON('Y', id, c.m.list())
		return nil
	case 'A', 'W', 'C', 'G', 'K', 'Z':
		var r request
		if err := json.Unmarshal(payload, &r); err != nil {
			return err
		}
		c.dispatch(kind, id, r)
		return nil
	}
	c.answer(id, failf("other", "unknown request %q", kind))
	return nil
}

func (c *conn) dispatch(kind byte, id uint32, r request) {
	if kind == 'W' {
		c.grant(id, r.Bytes)
		return
	}
	p := c.m.get(r.Proc)
	if p == nil {
		c.answer(id, failf("proc", "no process %d", r.Proc))
		return
	}
	switch kind {
	case 'A':
		c.attach(id, p, r.Offset, r.Window)
	case 'C':
		p.closeStdin(func(err error) { c.answer(id, err) })
	case 'G':
		c.answer(id, p.signal(r.Signal, r.SpareLeader))
	case 'K':
		go func() { p.kill(); <-p.done; c.answer(id, nil) }()
	case 'Z':
		c.answer(id, p.resize(r.Rows, r.Cols))
	}
}

func (c *conn) start(id uint32, s *procSpec) {
	p, err := c.m.spawn(s)
	if err != nil {
		c.answer(id, err)
		return
	}
	c.sendJSON('Y', id, map[string]int{"proc": p.n, "pid": p.pid})
}

func (c *conn) stdin(id uint32, payload []byte) error {
	if len(payload) < 4 {
		return errBadFrame
	}
	n := int(binary.BigEndian.Uint32(payload))
	p := c.m.get(n)
	if p == nil {
		c.answer(id, failf("proc", "no process %d", n))
		return nil
	}
	p.write(payload[4:], func(err error) { c.answer(id, err) })
	return nil
}

func (m *manager) list() []map[string]any {
	all := m.all()
	out := make([]map[string]any, 0, len(all))
	for _, p := range all {
		p.mu.Lock()
		code, sig := p.exit.code, p.exit.signal
		running := p.exit.at.IsZero()
		p.mu.Unlock()
		out = append(out, map[string]any{
			"proc": p.n, "pid": p.pid, "name": p.name, "argv": p.argv, "running": running,
			"code": code, "signal": sig, "started_at": float64(p.started.UnixNano()) / 1e9,
		})
	}
	return out
}
