package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as corral-exec: run with this variable set it is main().
const asMainVar = "CORRAL_PROCS_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(asMainVar) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type pframe struct {
	kind    byte
	id      uint32
	payload []byte
}

// client speaks the protocol to a manager (or relay) run as a subprocess.
type client struct {
	t      *testing.T
	cmd    *exec.Cmd
	in     io.WriteCloser
	wmu    sync.Mutex
	mu     sync.Mutex
	queues map[uint32]chan pframe
	last   uint32
	hello  map[string]any
}

func runManager(t *testing.T, args ...string) *client {
	t.Helper()
	c := launch(t, args...)
	h := c.next(0)
	if h.kind != 'H' {
		t.Fatalf("first frame %q %s", h.kind, h.payload)
	}
	if err := json.Unmarshal(h.payload, &c.hello); err != nil {
		t.Fatal(err)
	}
	return c
}

func launch(t *testing.T, args ...string) *client {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	// Without TERM, as under a harness: a terminal's default is seen.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TERM=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, asMainVar+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &client{t: t, cmd: cmd, in: in, queues: map[uint32]chan pframe{}}
	go c.readLoop(out)
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
			t.Errorf("%v did not end with its stdin", args)
		}
	})
	return c
}

func (c *client) queue(id uint32) chan pframe {
	c.mu.Lock()
	defer c.mu.Unlock()
	q, ok := c.queues[id]
	if !ok {
		q = make(chan pframe, 1<<14)
		c.queues[id] = q
	}
	return q
}

func (c *client) readLoop(out io.Reader) {
	in := bufio.NewReader(out)
	for {
		kind, id, payload, err := readFrame(in)
		if err != nil {
			return
		}
		c.queue(id) <- pframe{kind, id, payload}
	}
}

func (c *client) nextWithin(id uint32, wait time.Duration) (pframe, bool) {
	select {
	case f := <-c.queue(id):
		return f, true
	case <-time.After(wait):
		return pframe{}, false
	}
}

func (c *client) next(id uint32) pframe {
	c.t.Helper()
	f, ok := c.nextWithin(id, 10*time.Second)
	if !ok {
		c.t.Fatalf("no frame on id %d", id)
	}
	return f
}

func (c *client) raw(kind byte, id uint32, payload []byte) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.in.Write(encodeFrame(kind, id, payload)); err != nil {
		c.t.Fatal(err)
	}
}

func (c *client) send(kind byte, v any) uint32 {
	c.mu.Lock()
	c.last++
	id := c.last
	c.mu.Unlock()
	payload, _ := json.Marshal(v)
	c.raw(kind, id, payload)
	return id
}

func decodeJSON(t *testing.T, f pframe) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(f.payload, &v); err != nil {
		t.Fatalf("%q frame: %v: %s", f.kind, err, f.payload)
	}
	return v
}

// expect reads the reply to id and checks its kind.
func (c *client) expect(id uint32, kind byte) pframe {
	c.t.Helper()
	f := c.next(id)
	if f.kind != kind {
		c.t.Fatalf("id %d: want %q, got %q %s", id, kind, f.kind, f.payload)
	}
	return f
}

func (c *client) call(kind byte, v any) pframe {
	c.t.Helper()
	return c.expect(c.send(kind, v), 'Y')
}

func (c *client) start(spec map[string]any) int {
	c.t.Helper()
	n, _ := c.startPid(spec)
	return n
}

func (c *client) startPid(spec map[string]any) (int, int) {
	c.t.Helper()
	if _, ok := spec["as_self"]; !ok {
		spec["as_self"] = true
	}
	reply := decodeJSON(c.t, c.call('S', spec))
	return int(reply["proc"].(float64)), int(reply["pid"].(float64))
}

func (c *client) attach(n int, offset, window int64) uint32 {
	return c.send('A', map[string]any{"proc": n, "offset": offset, "window": window})
}

func (c *client) stdin(n int, data string) uint32 {
	payload := binary.BigEndian.AppendUint32(nil, uint32(n))
	c.mu.Lock()
	c.last++
	id := c.last
	c.mu.Unlock()
	c.raw('I', id, append(payload, data...))
	return id
}

type output struct {
	frames  []pframe
	streams map[byte]*bytes.Buffer
	exit    map[string]any
}

// collect reads a subscription to its end.
func (c *client) collect(id uint32) output {
	c.t.Helper()
	o := output{streams: map[byte]*bytes.Buffer{'o': {}, 'e': {}, 't': {}}}
	for o.exit == nil {
		f := c.next(id)
		o.frames = append(o.frames, f)
		switch f.kind {
		case 'o', 'e', 't':
			o.streams[f.kind].Write(f.payload)
		case 'X':
			o.exit = decodeJSON(c.t, f)
		case 'B':
		default:
			c.t.Fatalf("unexpected %q %s", f.kind, f.payload)
		}
	}
	return o
}

// waitOutput reads a subscription until its output matches.
func (c *client) waitOutput(id uint32, seen *bytes.Buffer, want *regexp.Regexp) {
	c.t.Helper()
	for !want.Match(seen.Bytes()) {
		f := c.next(id)
		if f.kind == 'X' {
			c.t.Fatalf("exited before %v; output %q", want, seen)
		}
		if f.kind == 'o' || f.kind == 'e' {
			seen.Write(f.payload)
		}
	}
}

func TestProcsEchoAndHello(t *testing.T) {
	c := runManager(t, "--procs-stdio")
	if c.hello["version"] != float64(2) || c.hello["pid"] != float64(c.cmd.Process.Pid) ||
		!regexp.MustCompile(`^[0-9a-f]{16}$`).MatchString(c.hello["epoch"].(string)) {
		t.Fatalf("hello %v", c.hello)
	}
	n := c.start(map[string]any{"argv": []string{"echo", "hello"}})
	out := c.collect(c.attach(n, 0, 1<<20))
	if b := decodeJSON(t, out.frames[0]); out.frames[0].kind != 'B' || b["offset"] != 0.0 || b["dropped"] != 0.0 {
		t.Fatalf("first frame %q %s", out.frames[0].kind, out.frames[0].payload)
	}
	if out.streams['o'].String() != "hello\n" || out.exit["code"] != 0.0 || out.exit["signal"] != nil {
		t.Fatalf("output %q exit %v", out.streams['o'], out.exit)
	}
}

func TestProcsStderrApart(t *testing.T) {
	c := runManager(t, "--procs-stdio")
	n := c.start(map[string]any{"argv": []string{"sh", "-c", "echo out; echo err >&2; exit 3"}})
	out := c.collect(c.attach(n, 0, 1<<20))
	if out.streams['o'].String() != "out\n" || out.streams['e'].String() != "err\n" || out.exit["code"] != 3.0 {
		t.Fatalf("stdout %q stderr %q exit %v", out.streams['o'], out.streams['e'], out.exit)
	}
	f := c.expect(c.send('S', map[string]any{"argv": []string{"no-such-program-here"}, "as_self": true}), 'F')
	if decodeJSON(t, f)["kind"] != "program" {
		t.Fatalf("missing program: %s", f.payload)
	}
	f = c.expect(c.send('S', map[string]any{"argv": []string{"true"}, "cwd": "/no/such/dir", "as_self": true}), 'F')
	if decodeJSON(t, f)["kind"] != "cwd" {
		t.Fatalf("missing cwd: %s", f.payload)
	}
}

func TestProcsStdinRoundTrip(t *testing.T) {
	c := runManager(t, "--procs-stdio")
	n := c.start(map[string]any{"argv": []string{"cat"}, "stdin": true})
	id := c.attach(n, 0, 1<<20)
	c.expect(c.stdin(n, "abc"), 'Y')
	var seen bytes.Buffer
	c.waitOutput(id, &seen, regexp.MustCompile(`^abc$`))
	c.expect(c.stdin(n, "def\n"), 'Y')
	c.call('C', map[string]any{"proc": n})
	c.expect(c.stdin(n, "late"), 'F')
	out := c.collect(id)
	if seen.String()+out.streams['o'].String() != "abcdef\n" || out.exit["code"] != 0.0 {
		t.Fatalf("output %q%q exit %v", seen.String(), out.streams['o'], out.exit)
	}
	n = c.start(map[string]any{"argv": []string{"true"}})
	c.expect(c.stdin(n, "x"), 'F')
	c.expect(c.send('C', map[string]any{"proc": n}), 'F')
}

// A process that never reads its stdin stalls its own writes, nothing else.
func TestProcsStdinStallsOnlyItsOwn(t *testing.T) {
	c := runManager(t, "--procs-stdio")
	n := c.start(map[string]any{"argv": []string{"sleep", "100"}, "stdin": true})
	stuck := c.stdin(n, strings.Repeat("x", 1<<20))
	echo := c.start(map[string]any{"argv": []string{"echo", "free"}})
	if out := c.collect(c.attach(echo, 0, 1<<20)); out.streams['o'].String() != "free\n" {
		t.Fatalf("meanwhile: %q", out.streams['o'])
	}
	if f, ok := c.nextWithin(stuck, 100*time.Millisecond); ok {
		t.Fatalf("a megabyte into a pipe nobody reads: %q", f.kind)
	}
	c.call('K', map[string]any{"proc": n})
	if f := c.expect(stuck, 'F'); decodeJSON(t, f)["kind"] != "stdin" {
		t.Fatalf("the stuck write: %s", f.payload)
	}
}

func TestProcsSignal(t *testing.T) {
	c := runManager(t, "--procs-stdio")
	n := c.start(map[string]any{"argv": []string{"sleep", "100"}})
	c.call('G', map[string]any{"proc": n, "signal": 2})
	out := c.collect(c.attach(n, 0, 1<<20))
	if out.exit["signal"] != 2.0 || out.exit["code"] != nil {
		t.Fatalf("exit %v", out.exit)
	}
	f := c.expect(c.send('G', map[string]any{"proc": n, "signal": 2}), 'F')
	if decodeJSON(t, f)["kind"] != "exited" {
		t.Fatalf("signal after exit: %s", f.payload)
	}
}

func TestProcsSignalSparesLeader(t *testing.T) {
	c := runManager(t, "--procs-stdio")
	n := c.start(map[string]any{"argv": []string{"sh", "-c", "sleep 100 & echo started; wait; echo survived"}})
	id := c.attach(n, 0, 1<<20)
	var seen bytes.Buffer
	c.waitOutput(id, &seen, regexp.MustCompile(`^started\n$`))
	c.call('G', map[string]any{"proc": n, "signal": 15, "spare_leader": true})
	out := c.collect(id)
	if out.streams['o'].String() != "survived\n" || out.exit["code"] != 0.0 {
		t.Fatalf("output %q exit %v", out.streams['o'], out.exit)
	}
}

func gone(pid int) bool {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(data, ')')
	return i > 0 && len(data) > i+2 && data[i+2] == 'Z'
}

func TestProcsKillTree(t *testing.T) {
	c := runManager(t, "--procs-stdio")
	marker := fmt.Sprintf("procs-test-%d", rand.Int63())
	n := c.start(map[string]any{
		"argv":   []string{"sh", "-c", `setsid sh -c 'echo $$; exec sleep 300' & wait`},
		"env":    []string{"CORRAL_EXEC=" + marker},
		"marker": marker,
	})
	id := c.attach(n, 0, 1<<20)
	var seen bytes.Buffer
	c.waitOutput(id, &seen, regexp.MustCompile(`^\d+\n$`))
	grandchild, _ := strconv.Atoi(strings.TrimSpace(seen.String()))
	c.call('K', map[string]any{"proc": n})
	list := c.call('L', map[string]any{})
	if !strings.Contains(string(list.payload), `"running":false`) {
		t.Fatalf("after the kill: %s", list.payload)
	}
	for deadline := time.Now().Add(3 * time.Second); !gone(grandchild); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(grandchild, syscall.SIGKILL)
			t.Fatalf("the setsid'd grandchild %d survived", grandchild)
		}
	}
	if out := c.collect(id); out.exit["signal"] != 9.0 {
		t.Fatalf("exit %v", out.exit)
	}
	c.call('K', map[string]any{"proc": n}) // exited: at once
}

// sleeping says whether a sleep runs in the process group.
func sleeping(pgid int) bool {
	entries, _ := os.ReadDir("/proc")
	for _, entry := range entries {
		pid, err := strconv.Atoi(entry.Name())
		stat, _ := os.ReadFile("/proc/" + entry.Name() + "/stat")
		if err == nil && pid != pgid && bytes.Contains(stat, []byte("(sleep)")) && processGroup(pid) == pgid {
			return true
		}
	}
	return false
}

func TestProcsPty(t *testing.T) {
	c := runManager(t, "--procs-stdio")
	n, pid := c.startPid(map[string]any{
		"argv": []string{"sh", "-c", "tty; read x; stty size; echo $TERM; sleep 100"},
		"pty":  map[string]int{"rows": 24, "cols": 80},
	})
	id := c.attach(n, 0, 1<<20)
	var seen bytes.Buffer
	c.waitOutput(id, &seen, regexp.MustCompile(`^/dev/pts/\d+\r\n`))
	c.call('Z', map[string]any{"proc": n, "rows": 40, "cols": 100})
	c.expect(c.stdin(n, "go\n"), 'Y')
	c.waitOutput(id, &seen, regexp.MustCompile(`\n40 100\r\nxterm-256color\r\n`))
	// A ^C between the shell's fork and its child's exec would be lost on the way.
	for deadline := time.Now().Add(5 * time.Second); !sleeping(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the shell did not start its sleep")
		}
	}
	c.expect(c.stdin(n, "\x03"), 'Y')
	started := time.Now()
	out := c.collect(id)
	if out.exit["signal"] != 2.0 && out.exit["code"] != 130.0 || time.Since(started) > 5*time.Second {
		t.Fatalf("exit %v after %v", out.exit, time.Since(started))
	}
	c.expect(c.send('C', map[string]any{"proc": n}), 'F')
	n = c.start(map[string]any{
		"argv": []string{"sh", "-c", "echo out; echo status >&3"},
		"pty":  map[string]int{"rows": 24, "cols": 80}, "status_fd": true,
	})
	if out := c.collect(c.attach(n, 0, 1<<20)); out.frames[1].kind != 'o' || out.streams['t'].String() != "status\n" {
		t.Fatalf("terminal and status: %q then %q %q", out.frames[1].kind, out.streams['o'], out.streams['t'])
	}
	plain := c.start(map[string]any{"argv": []string{"true"}})
	c.expect(c.send('Z', map[string]any{"proc": plain, "rows": 1, "cols": 1}), 'F')
}

func TestProcsStatusAfterOutput(t *testing.T) {
	c := runManager(t, "--procs-stdio")
	script := `for i in 1 2 3 4 5; do head -c 102400 /dev/zero | tr '\000' a; echo $i >&3; done`
	n := c.start(map[string]any{"argv": []string{"sh", "-c", script}, "status_fd": true})
	out := c.collect(c.attach(n, 0, 1<<30))
	stdout, status := 0, ""
	for _, f := range out.frames {
		switch f.kind {
		case 'o':
			stdout += len(f.payload)
		case 't':
			status += string(f.payload)
			lines := strings.Fields(status)
			k, _ := strconv.Atoi(lines[len(lines)-1])
			if stdout < k*102400 {
				t.Fatalf("status %q arrived after %d bytes of stdout", status, stdout)
			}
		}
	}
	if status != "1\n2\n3\n4\n5\n" || stdout != 5*102400 {
		t.Fatalf("status %q, %d bytes of stdout", status, stdout)
	}
}

func procStatus(t *testing.T, pid int, field string) int {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(field + `:\s+(\d+)`).FindSubmatch(data)
	value, _ := strconv.Atoi(string(m[1]))
	return value
}

func rss(t *testing.T, pid int) int { return procStatus(t, pid, "VmRSS") << 10 }

func TestProcsBoundedBuffer(t *testing.T) {
	c := runManager(t, "--procs-stdio")
	n := c.start(map[string]any{"argv": []string{"yes", "0123456789abcdef"}, "buffer": 4096})
	time.Sleep(300 * time.Millisecond)
	id := c.attach(n, 0, 1000)
	b := decodeJSON(t, c.expect(id, 'B'))
	if b["dropped"].(float64) <= 0 || b["offset"] != b["dropped"] {
		t.Fatalf("first B %v", b)
	}
	got := 0
	for got < 1000 {
		if f := c.next(id); f.kind == 'o' {
			got += len(f.payload)
		} else if f.kind != 'B' {
			t.Fatalf("%q %s", f.kind, f.payload)
		}
	}
	if got != 1000 {
		t.Fatalf("window 1000, got %d bytes", got)
	}
	time.Sleep(300 * time.Millisecond) // the ring moves on past what this one was sent
	c.raw('W', id, []byte(`{"bytes": 1048576}`))
	if f := c.next(id); f.kind != 'B' || decodeJSON(t, f)["dropped"].(float64) <= 0 {
		t.Fatalf("after the gap: %q %s", f.kind, f.payload)
	}
	if used := rss(t, c.cmd.Process.Pid); used > 64<<20 {
		t.Fatalf("the manager holds %d MiB", used>>20)
	} else {
		t.Logf("the manager holds %d MiB", used>>20)
	}
	c.call('K', map[string]any{"proc": n})
	if out := c.collect(id); out.exit["signal"] != 9.0 || out.exit["dropped"].(float64) <= b["dropped"].(float64) {
		t.Fatalf("exit %v", out.exit)
	}
}

func TestProcsWindow(t *testing.T) {
	c := runManager(t, "--procs-stdio")
	n := c.start(map[string]any{"argv": []string{"head", "-c", "5000", "/dev/zero"}})
	id := c.attach(n, 0, 1000)
	c.expect(id, 'B')
	got := 0
	for got < 1000 {
		got += len(c.expect(id, 'o').payload)
	}
	if f, ok := c.nextWithin(id, 300*time.Millisecond); ok || got != 1000 {
		t.Fatalf("beyond the window (%d bytes): %q %d bytes", got, f.kind, len(f.payload))
	}
	c.raw('W', id, []byte(`{"bytes": 4000}`))
	out := c.collect(id)
	if got+out.streams['o'].Len() != 5000 || out.exit["dropped"] != 0.0 {
		t.Fatalf("got %d+%d bytes, exit %v", got, out.streams['o'].Len(), out.exit)
	}
	// Detached: nothing more on that id after the 'Y'.
	n = c.start(map[string]any{"argv": []string{"yes"}})
	id = c.attach(n, 0, 1<<20)
	c.expect(id, 'B')
	c.raw('D', id, nil)
	for f := c.next(id); f.kind != 'Y'; f = c.next(id) {
		if f.kind != 'o' && f.kind != 'B' {
			t.Fatalf("before the detach's Y: %q", f.kind)
		}
	}
	c.call('K', map[string]any{"proc": n})
	if f, ok := c.nextWithin(id, 200*time.Millisecond); ok {
		t.Fatalf("after the detach: %q", f.kind)
	}
}

type listed struct {
	Proc    int      `json:"proc"`
	Name    string   `json:"name"`
	Argv    []string `json:"argv"`
	Running bool     `json:"running"`
	Code    *int     `json:"code"`
	Signal  *int     `json:"signal"`
}

func (c *client) list() map[int]listed {
	var all []listed
	if err := json.Unmarshal(c.call('L', map[string]any{}).payload, &all); err != nil {
		c.t.Fatal(err)
	}
	byNumber := map[int]listed{}
	for _, p := range all {
		byNumber[p.Proc] = p
	}
	return byNumber
}

func TestProcsListAndNumbers(t *testing.T) {
	c := runManager(t, "--procs-stdio")
	done := c.start(map[string]any{"argv": []string{"true"}, "name": "quick"})
	c.collect(c.attach(done, 0, 1<<20))
	running := c.start(map[string]any{"argv": []string{"sleep", "100"}, "name": "slow"})
	all := c.list()
	if p := all[done]; p.Running || p.Code == nil || *p.Code != 0 || p.Name != "quick" {
		t.Fatalf("finished: %+v", p)
	}
	if p := all[running]; !p.Running || p.Code != nil || p.Argv[0] != "sleep" {
		t.Fatalf("running: %+v", p)
	}
	c.call('K', map[string]any{"proc": running})
	if p := c.list()[running]; p.Running || p.Signal == nil || *p.Signal != 9 {
		t.Fatalf("killed: %+v", p)
	}
	if again := c.start(map[string]any{"argv": []string{"true"}}); again <= running || running <= done {
		t.Fatalf("numbers %d, %d, %d", done, running, again)
	}
	for _, kind := range []byte{'A', 'G', 'K', 'Z', 'C'} {
		f := c.expect(c.send(kind, map[string]any{"proc": 999}), 'F')
		if decodeJSON(t, f)["kind"] != "proc" {
			t.Fatalf("%q to no process: %s", kind, f.payload)
		}
	}
}

func TestProcsRelayAndDaemon(t *testing.T) {
	sid := fmt.Sprintf("test-sid-%d", rand.Int63())
	first := runManager(t, "--procs", sid)
	daemon := int(first.hello["pid"].(float64))
	t.Cleanup(func() { _ = syscall.Kill(daemon, syscall.SIGKILL) })
	if daemon == first.cmd.Process.Pid {
		t.Fatal("the relay is not the manager")
	}
	n := first.start(map[string]any{"argv": []string{"sleep", "100"}})
	second := runManager(t, "--procs", sid)
	if second.hello["epoch"] != first.hello["epoch"] || second.hello["pid"] != first.hello["pid"] {
		t.Fatalf("two managers: %v, %v", first.hello, second.hello)
	}
	if p := second.list()[n]; !p.Running {
		t.Fatalf("the second connection's list: %v", second.list())
	}
	id := second.attach(n, 0, 1<<20)
	second.expect(id, 'B')
	first.in.Close() // one connection's end leaves the processes alone
	time.Sleep(100 * time.Millisecond)
	if p := second.list()[n]; !p.Running {
		t.Fatalf("after the first connection ended: %+v", p)
	}
	second.call('K', map[string]any{"proc": n})
	if out := second.collect(id); out.exit["signal"] != 9.0 {
		t.Fatalf("exit %v", out.exit)
	}
	bad := launch(t, "--procs", "Bad_SID")
	if err := bad.cmd.Wait(); bad.cmd.ProcessState.ExitCode() != 2 {
		t.Fatalf("bad SID: %v", err)
	}
}

func TestProcsRelayRefusesSquatter(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3 to squat the address with")
	}
	sid := fmt.Sprintf("test-sid-%d", rand.Int63())
	squatter := exec.Command("python3", "-c", `import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.bind("\0corral-procs-" + sys.argv[1])
s.listen(5)
print("ready", flush=True)
time.sleep(30)`, sid)
	out, _ := squatter.StdoutPipe()
	if err := squatter.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = squatter.Process.Kill(); _ = squatter.Wait() })
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "ready\n" {
		t.Fatalf("squatter: %q", line)
	}
	relay := launch(t, "--procs", sid)
	if f := relay.next(0); f.kind != 'F' || !strings.Contains(string(f.payload), "another program") {
		t.Fatalf("relay to a squatter: %q %s", f.kind, f.payload)
	}
	if _ = relay.cmd.Wait(); relay.cmd.ProcessState.ExitCode() != 1 {
		t.Fatalf("relay exit %v", relay.cmd.ProcessState)
	}
}

func TestProcsStdioEndKillsEverything(t *testing.T) {
	c := runManager(t, "--procs-stdio")
	pid := int(decodeJSON(t, c.call('S', map[string]any{"argv": []string{"sleep", "100"}, "as_self": true}))["pid"].(float64))
	c.wmu.Lock()
	_, _ = c.in.Write([]byte{0, 0, 0, 3, 'L', 0, 0, 0, 1}) // too short to be a frame
	c.wmu.Unlock()
	if err := c.cmd.Wait(); err != nil {
		t.Fatalf("manager: %v", err)
	}
	for deadline := time.Now().Add(3 * time.Second); !gone(pid); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatal("a process outlived the manager")
		}
	}
}

func TestProcsCgroupRequired(t *testing.T) {
	c := runManager(t, "--procs-stdio", "/no/such/cgroup")
	f := c.expect(c.send('S', map[string]any{"argv": []string{"true"}, "as_self": true}), 'F')
	if decodeJSON(t, f)["kind"] != "other" || !strings.Contains(string(f.payload), "cgroup") {
		t.Fatalf("start outside the cgroup: %s", f.payload)
	}
}

func TestProcsSwitchesUser(t *testing.T) {
	if os.Getuid() != 0 || !canSwitchUser() {
		t.Skip("needs root")
	}
	if _, err := resolveUser("nobody"); err != nil {
		t.Skip("no user nobody")
	}
	c := runManager(t, "--procs-stdio")
	n := c.start(map[string]any{"argv": []string{"sh", "-c", "id -u; echo $HOME"}, "user": "nobody", "as_self": false})
	out := c.collect(c.attach(n, 0, 1<<20))
	u, _ := resolveUser("nobody")
	if want := fmt.Sprintf("%d\n%s\n", u.uid, u.home); out.streams['o'].String() != want {
		t.Fatalf("as nobody: %q, want %q", out.streams['o'], want)
	}
	n = c.start(map[string]any{
		"argv": []string{"sh", "-c", "id -u; test -w $(tty) && echo writable"}, "user": "nobody",
		"as_self": false, "pty": map[string]int{"rows": 24, "cols": 80},
	})
	out = c.collect(c.attach(n, 0, 1<<20))
	if want := fmt.Sprintf("%d\r\nwritable\r\n", u.uid); out.streams['o'].String() != want {
		t.Fatalf("a terminal as nobody: %q, want %q", out.streams['o'], want)
	}
}

// Kernels before 5.3 have no pidfd: a thread waits for the process instead.
func TestProcsWithoutPidfd(t *testing.T) {
	saved := pidfdOpen
	pidfdOpen = func(int) (int, error) { return -1, syscall.ENOSYS }
	defer func() { pidfdOpen = saved }()
	p, err := newManager("").spawn(&procSpec{spec: spec{Argv: []string{"sh", "-c", "echo hi; exit 3"}, AsSelf: true}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		t.Fatal("no exit")
	}
	var buf [16]byte
	n, _ := p.ring.read(0, len(buf), buf[:])
	if *p.exit.code != 3 || string(buf[:n]) != "hi\n" {
		t.Fatalf("exit %v, output %q", *p.exit.code, buf[:n])
	}
}

// Waiting for a process holds no thread of the manager's.
func TestProcsManyProcesses(t *testing.T) {
	c := runManager(t, "--procs-stdio")
	var procs []int
	for i := 0; i < 100; i++ {
		procs = append(procs, c.start(map[string]any{"argv": []string{"sleep", "100"}}))
	}
	threads := procStatus(t, c.cmd.Process.Pid, "Threads")
	t.Logf("%d threads for %d processes", threads, len(procs))
	if threads > 40 {
		t.Fatalf("%d threads for %d processes", threads, len(procs))
	}
	var ids []uint32
	for _, n := range procs {
		ids = append(ids, c.send('K', map[string]any{"proc": n}))
	}
	for _, id := range ids {
		c.expect(id, 'Y')
	}
}

// A started process runs inside the manager's cgroup from its first instruction, with
// either toolchain's way of putting it there (procs_cgroup*.go).
func TestProcsStartInsideTheCgroup(t *testing.T) {
	root := cgroup2Mount(t)
	dir, err := os.MkdirTemp(root, "corral-procs-test-")
	if err != nil {
		t.Skipf("cannot make a cgroup under %s (needs root): %v", root, err)
	}
	defer os.Remove(dir)
	c := runManager(t, "--procs-stdio", dir)
	for _, asSelf := range []bool{true, false} {
		n := c.start(map[string]any{"argv": []string{"cat", "/proc/self/cgroup"}, "as_self": asSelf})
		out := c.collect(c.attach(n, 0, 1<<20)).streams['o'].String()
		if want := "0::/" + strings.TrimPrefix(dir, root+"/") + "\n"; !strings.HasSuffix(out, want) {
			t.Fatalf("as_self=%v: %q, want it to end %q", asSelf, out, want)
		}
	}
}

func cgroup2Mount(t *testing.T) string {
	t.Helper()
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[2] == "cgroup2" {
			return f[1]
		}
	}
	t.Skip("no cgroup v2 mount")
	return ""
}
