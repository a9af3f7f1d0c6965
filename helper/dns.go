// corral's resolver: `corral-exec --dns DIR`, run by corral in the *holder* (which owns
// the sandbox's network namespace and alone has NET_ADMIN there) while an allowlist with
// a hostname (exact, or a wildcard `*.example.com`) may be in force.
//
// `corral-exec --dns-query SERVER MARK` is corral's own apply-time lookup from the holder:
// the same marked upstream path, for the queries corral builds (see dnsQueryMain).
//
// It listens on 127.0.0.54:53 (UDP and TCP) in that namespace, the only resolver the
// sandbox can reach under such a policy, and answers:
//
//   - a name the policy allows (under one of its wildcards, or one of its exact hostnames):
//     the query goes upstream (over TCP, with socket mark CONFIG.mark, which only a holder
//     of NET_ADMIN can set and which corral's rules accept first), every A/AAAA address
//     of the answer (for the name or its CNAME chain) is added to the ipsets of the
//     entries the name matches, for the answer's TTL clamped to [ttl_min, ttl_max], and
//     only then is the answer sent back. If the addresses cannot be added, the client gets
//     SERVFAIL: it never learns an address the rules would refuse.
//   - anything else: REFUSED, and nothing is sent upstream.
//
// Its configuration is DIR/config.json, in the holder's filesystem (the sandbox shares no
// part of it), written by corral; SIGHUP reloads it, and DIR/loaded then holds the
// generation loaded (or `error: ...`, with every name refused). DIR/pid holds its pid.
//
// Everything the sandbox sends is hostile: a query is parsed with every length checked,
// names are held to letters, digits, '-' and '_' in labels of 1-63 bytes (so a label with
// a '.' in it cannot pass for two), and each query runs under recover().
package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	dnsListen       = "127.0.0.54:53"
	dnsHeaderLen    = 12
	dnsTypeA        = 1
	dnsTypeCNAME    = 5
	dnsTypeAAAA     = 28
	dnsTypeOPT      = 41
	dnsClassIN      = 1
	rcodeServFail   = 2
	rcodeRefused    = 5
	upstreamTimeout = 3 * time.Second
	tcpIdle         = 10 * time.Second
	maxInflight     = 128
	// At most this many `ipset restore` run at once, whatever the sandbox sends: they
	// share the holder's process budget (pids_limit) with corral's own commands there,
	// which a query flood must never starve.
	maxSetWriters = 4
	setTimeout    = 5 * time.Second
	maxChain      = 16
)

var setName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,31}$`)

type dnsEntry struct {
	Name     string `json:"name"`
	Wildcard bool   `json:"wildcard"`
	Set4     string `json:"set4"`
	Set6     string `json:"set6"`
	// the port of the policy's entry (0: any); the name gate admits the name on it
	Port int `json:"port"`
}

type dnsConfig struct {
	Generation string     `json:"generation"`
	Upstream   []string   `json:"upstream"`
	Mark       uint32     `json:"mark"`
	TTLMin     uint32     `json:"ttl_min"`
	TTLMax     uint32     `json:"ttl_max"`
	Entries    []dnsEntry `json:"entries"`
}

func parseConfig(data []byte) (*dnsConfig, error) {
	var cfg dnsConfig
	if err := json.Unmarshal(data, &cfg); err != nil {
		return nil, err
	}
	if !setName.MatchString(cfg.Generation) {
		return nil, fmt.Errorf("bad generation %q", cfg.Generation)
	}
	for _, up := range cfg.Upstream {
		if net.ParseIP(up) == nil {
			return nil, fmt.Errorf("upstream %q is not an IP address", up)
		}
	}
	if len(cfg.Entries) > 0 && len(cfg.Upstream) == 0 {
		return nil, errors.New("entries but no upstream resolver")
	}
	if cfg.TTLMin == 0 || cfg.TTLMax < cfg.TTLMin {
		return nil, fmt.Errorf("bad ttl bounds %d..%d", cfg.TTLMin, cfg.TTLMax)
	}
	for _, e := range cfg.Entries {
		if _, ok := normalName(e.Name); !ok {
			return nil, fmt.Errorf("bad entry name %q", e.Name)
		}
		if !setName.MatchString(e.Set4) || !setName.MatchString(e.Set6) {
			return nil, fmt.Errorf("bad set names %q %q", e.Set4, e.Set6)
		}
		if e.Port < 0 || e.Port > 65535 {
			return nil, fmt.Errorf("bad port %d", e.Port)
		}
	}
	return &cfg, nil
}

// normalName lowercases a dotted name and checks its labels; the empty name is not valid.
func normalName(name string) (string, bool) {
	name = strings.ToLower(strings.TrimSuffix(name, "."))
	if name == "" || len(name) > 253 {
		return "", false
	}
	for _, label := range strings.Split(name, ".") {
		if !validLabel(label) {
			return "", false
		}
	}
	return name, true
}

func validLabel(label string) bool {
	if len(label) == 0 || len(label) > 63 {
		return false
	}
	for i := 0; i < len(label); i++ {
		c := label[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// matches: the entries that allow `name` (already normalized). A wildcard `*.d` allows
// names with at least one label before `d`, not `d` itself.
func (c *dnsConfig) matches(name string) []dnsEntry {
	var found []dnsEntry
	for _, e := range c.Entries {
		if e.Wildcard {
			if strings.HasSuffix(name, "."+e.Name) {
				found = append(found, e)
			}
		} else if name == e.Name {
			found = append(found, e)
		}
	}
	return found
}

type question struct {
	name   string
	qtype  uint16
	end    int // offset just past the question
	udpMax int // the client's EDNS payload size, or 512
}

// parseQuery reads a query's header and its one question; any other shape is an error.
func parseQuery(msg []byte) (question, error) {
	var q question
	if len(msg) < dnsHeaderLen {
		return q, errors.New("short header")
	}
	flags := binary.BigEndian.Uint16(msg[2:4])
	if flags&0x8000 != 0 || (flags>>11)&0xF != 0 {
		return q, errors.New("not a standard query")
	}
	if binary.BigEndian.Uint16(msg[4:6]) != 1 {
		return q, errors.New("not exactly one question")
	}
	labels := []string{}
	offset := dnsHeaderLen
	for {
		if offset >= len(msg) {
			return q, errors.New("name runs past the message")
		}
		length := int(msg[offset])
		offset++
		if length == 0 {
			break
		}
		if length > 63 || offset+length > len(msg) {
			return q, errors.New("bad label")
		}
		label := strings.ToLower(string(msg[offset : offset+length]))
		if !validLabel(label) {
			return q, errors.New("label outside [a-z0-9_-]")
		}
		labels = append(labels, label)
		offset += length
	}
	if offset+4 > len(msg) {
		return q, errors.New("question runs past the message")
	}
	q.name = strings.Join(labels, ".")
	if q.name == "" || len(q.name) > 253 {
		return q, errors.New("bad name length")
	}
	q.qtype = binary.BigEndian.Uint16(msg[offset : offset+2])
	if binary.BigEndian.Uint16(msg[offset+2:offset+4]) != dnsClassIN {
		return q, errors.New("not class IN")
	}
	q.end = offset + 4
	q.udpMax = 512
	// An OPT record (root name, type 41) as the only additional record: its class is the
	// client's UDP payload size.
	if binary.BigEndian.Uint16(msg[10:12]) == 1 && q.end+11 <= len(msg) && msg[q.end] == 0 &&
		binary.BigEndian.Uint16(msg[q.end+1:q.end+3]) == dnsTypeOPT {
		size := int(binary.BigEndian.Uint16(msg[q.end+3 : q.end+5]))
		if size > 512 {
			q.udpMax = size
			if size > 4096 {
				q.udpMax = 4096
			}
		}
	}
	return q, nil
}

// readName reads a possibly compressed name at offset; returns it and the offset after it.
func readName(msg []byte, offset int) (string, int, error) {
	labels := []string{}
	end := -1
	for jumps := 0; ; {
		if offset >= len(msg) {
			return "", 0, errors.New("name runs past the message")
		}
		length := int(msg[offset])
		switch {
		case length == 0:
			if end < 0 {
				end = offset + 1
			}
			return strings.ToLower(strings.Join(labels, ".")), end, nil
		case length&0xC0 == 0xC0:
			if offset+1 >= len(msg) {
				return "", 0, errors.New("pointer runs past the message")
			}
			if end < 0 {
				end = offset + 2
			}
			jumps++
			if jumps > 64 {
				return "", 0, errors.New("compression loop")
			}
			offset = int(binary.BigEndian.Uint16(msg[offset:offset+2]) & 0x3FFF)
		case length > 63:
			return "", 0, errors.New("bad label length")
		default:
			if offset+1+length > len(msg) {
				return "", 0, errors.New("label runs past the message")
			}
			labels = append(labels, string(msg[offset+1:offset+1+length]))
			offset += 1 + length
			if len(labels) > 127 {
				return "", 0, errors.New("too many labels")
			}
		}
	}
}

type address struct {
	ip  net.IP
	ttl uint32
}

type record struct {
	owner, target string
	rtype         uint16
	ttl           uint32
	rdata         []byte
}

// answerAddresses: the A/AAAA addresses an answer gives for `name` or its CNAME chain.
func answerAddresses(msg []byte, id uint16, name string) ([]address, error) {
	if len(msg) < dnsHeaderLen {
		return nil, errors.New("short answer")
	}
	if binary.BigEndian.Uint16(msg[0:2]) != id || msg[2]&0x80 == 0 {
		return nil, errors.New("answer does not match the query")
	}
	qd := int(binary.BigEndian.Uint16(msg[4:6]))
	an := int(binary.BigEndian.Uint16(msg[6:8]))
	offset := dnsHeaderLen
	for i := 0; i < qd; i++ {
		_, next, err := readName(msg, offset)
		if err != nil {
			return nil, err
		}
		offset = next + 4
	}
	var records []record
	for i := 0; i < an; i++ {
		owner, next, err := readName(msg, offset)
		if err != nil {
			return nil, err
		}
		if next+10 > len(msg) {
			return nil, errors.New("record runs past the message")
		}
		rtype := binary.BigEndian.Uint16(msg[next : next+2])
		class := binary.BigEndian.Uint16(msg[next+2 : next+4])
		ttl := binary.BigEndian.Uint32(msg[next+4 : next+8])
		rdlen := int(binary.BigEndian.Uint16(msg[next+8 : next+10]))
		start := next + 10
		if start+rdlen > len(msg) {
			return nil, errors.New("rdata runs past the message")
		}
		offset = start + rdlen
		if class != dnsClassIN {
			continue
		}
		r := record{owner: owner, rtype: rtype, ttl: ttl, rdata: msg[start:offset]}
		if rtype == dnsTypeCNAME {
			target, _, err := readName(msg, start)
			if err != nil {
				return nil, err
			}
			r.target = target
		}
		records = append(records, r)
	}
	chain := map[string]bool{name: true}
	for i := 0; i < maxChain; i++ {
		grew := false
		for _, r := range records {
			if r.rtype == dnsTypeCNAME && chain[r.owner] && !chain[r.target] {
				chain[r.target] = true
				grew = true
			}
		}
		if !grew {
			break
		}
	}
	var found []address
	for _, r := range records {
		if !chain[r.owner] {
			continue
		}
		if (r.rtype == dnsTypeA && len(r.rdata) == 4) || (r.rtype == dnsTypeAAAA && len(r.rdata) == 16) {
			found = append(found, address{ip: net.IP(append([]byte(nil), r.rdata...)), ttl: r.ttl})
		}
	}
	return found, nil
}

// reply builds a header-and-question answer to `query` with `rcode` (and TC if `truncated`).
func reply(query []byte, q question, rcode uint16, truncated bool) []byte {
	out := make([]byte, q.end)
	copy(out, query[:q.end])
	flags := binary.BigEndian.Uint16(query[2:4])
	flags = 0x8000 | flags&0x0100 | 0x0080 | rcode // QR, RD copied, RA
	if truncated {
		flags |= 0x0200
	}
	binary.BigEndian.PutUint16(out[2:4], flags)
	binary.BigEndian.PutUint16(out[4:6], 1)
	binary.BigEndian.PutUint16(out[6:8], 0)
	binary.BigEndian.PutUint16(out[8:10], 0)
	binary.BigEndian.PutUint16(out[10:12], 0)
	return out
}

type resolver struct {
	mu      sync.RWMutex
	cfg     *dnsConfig
	dir     string
	slots   chan struct{}
	addSets func(lines []string) error
	ask     func(cfg *dnsConfig, query []byte) ([]byte, error)
	// the name gate's open flows (gate.go): flowsMu is taken before mu
	flowsMu sync.Mutex
	flows   map[*flow]struct{}
}

func (r *resolver) config() *dnsConfig {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.cfg
}

// answer: the reply to one query, or nil to send nothing (a malformed query).
func (r *resolver) answer(query []byte, overUDP bool) (out []byte) {
	defer func() {
		if recover() != nil {
			out = nil
		}
	}()
	q, err := parseQuery(query)
	if err != nil {
		return nil
	}
	cfg := r.config()
	entries := cfg.matches(q.name)
	if len(entries) == 0 {
		return reply(query, q, rcodeRefused, false)
	}
	answer, err := r.ask(cfg, query)
	if err != nil {
		return reply(query, q, rcodeServFail, false)
	}
	found, err := answerAddresses(answer, binary.BigEndian.Uint16(query[0:2]), q.name)
	if err != nil {
		return reply(query, q, rcodeServFail, false)
	}
	if len(found) > 0 {
		var lines []string
		for _, a := range found {
			ttl := a.ttl
			if ttl < cfg.TTLMin {
				ttl = cfg.TTLMin
			}
			if ttl > cfg.TTLMax {
				ttl = cfg.TTLMax
			}
			if len(a.ip) == net.IPv6len && a.ip.To4() != nil {
				continue // v4-mapped: the kernel sends IPv4, which the v4 set decides
			}
			for _, e := range entries {
				set := e.Set6
				if len(a.ip) == net.IPv4len {
					set = e.Set4
				}
				lines = append(lines, fmt.Sprintf("add %s %s timeout %d", set, a.ip.String(), ttl))
			}
		}
		if err := r.writeSets(lines); err != nil {
			fmt.Fprintf(os.Stderr, "corral-dns: adding %s's addresses failed: %v\n", q.name, err)
			return reply(query, q, rcodeServFail, false)
		}
	}
	if overUDP && len(answer) > q.udpMax {
		return reply(query, q, 0, true)
	}
	return answer
}

var setWriters = make(chan struct{}, maxSetWriters)

func (r *resolver) writeSets(lines []string) error {
	setWriters <- struct{}{}
	defer func() { <-setWriters }()
	return r.addSets(lines)
}

func ipsetAdd(lines []string) error {
	ctx, cancel := context.WithTimeout(context.Background(), setTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ipset", "restore", "-exist")
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// markedDialer dials from sockets carrying `mark` (setting it needs NET_ADMIN).
func markedDialer(mark uint32) *net.Dialer {
	return &net.Dialer{
		Timeout: upstreamTimeout,
		Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			if err := c.Control(func(fd uintptr) {
				serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_MARK, int(mark))
			}); err != nil {
				return err
			}
			return serr
		},
	}
}

// askUpstream sends the query, as the client wrote it, over TCP to each upstream in turn,
// from a socket carrying the mark corral's rules let through.
func askUpstream(cfg *dnsConfig, query []byte) ([]byte, error) {
	dialer := markedDialer(cfg.Mark)
	var last error = errors.New("no upstream")
	for _, up := range cfg.Upstream {
		conn, err := dialer.Dial("tcp", net.JoinHostPort(up, "53"))
		if err != nil {
			last = err
			continue
		}
		answer, err := exchangeTCP(conn, query)
		conn.Close()
		if err == nil {
			return answer, nil
		}
		last = err
	}
	return nil, last
}

func exchangeTCP(conn net.Conn, query []byte) ([]byte, error) {
	_ = conn.SetDeadline(time.Now().Add(upstreamTimeout))
	framed := make([]byte, 2+len(query))
	binary.BigEndian.PutUint16(framed, uint16(len(query)))
	copy(framed[2:], query)
	if _, err := conn.Write(framed); err != nil {
		return nil, err
	}
	var size [2]byte
	if _, err := io.ReadFull(conn, size[:]); err != nil {
		return nil, err
	}
	answer := make([]byte, binary.BigEndian.Uint16(size[:]))
	if _, err := io.ReadFull(conn, answer); err != nil {
		return nil, err
	}
	return answer, nil
}

// maxQueryInput bounds what --dns-query reads from corral (framed queries, a few per name).
const maxQueryInput = 1 << 20

// dnsQueryMain: corral's own lookups at apply time, from the holder. The length-framed
// queries corral built arrive on stdin; they go, as they are, over one TCP connection to
// SERVER port 53 from a socket carrying MARK, which corral's rules (or the rule corral
// adds around this call) let through whatever policy is in force, and which nothing in
// the sandbox can set. The framed answers go to stdout, until one came back per query,
// the server closed, or upstreamTimeout passed; corral parses and checks them. Exit 1:
// the server could not be reached (nothing written).
func dnsQueryMain(server, markText string) {
	mark, err := strconv.ParseUint(markText, 0, 32)
	if err != nil || net.ParseIP(server) == nil {
		fmt.Fprintln(os.Stderr, "usage: corral-exec --dns-query SERVER-IP MARK")
		os.Exit(2)
	}
	input, err := io.ReadAll(io.LimitReader(os.Stdin, maxQueryInput))
	if err != nil {
		fmt.Fprintf(os.Stderr, "corral-dns-query: reading the queries: %v\n", err)
		os.Exit(2)
	}
	conn, err := markedDialer(uint32(mark)).Dial("tcp", net.JoinHostPort(server, "53"))
	if err != nil {
		fmt.Fprintf(os.Stderr, "corral-dns-query: %v\n", err)
		os.Exit(1)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(upstreamTimeout))
	if err := exchangeAll(conn, input, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "corral-dns-query: %v\n", err)
	}
}

// exchangeAll writes the framed queries in `input` to conn and copies one framed answer
// per query to out, stopping early (with what came) if the server closes or times out.
func exchangeAll(conn net.Conn, input []byte, out io.Writer) error {
	count := 0
	for offset := 0; offset+2 <= len(input); count++ {
		offset += 2 + int(binary.BigEndian.Uint16(input[offset:offset+2]))
		if offset > len(input) {
			return errors.New("a query runs past the input")
		}
	}
	if _, err := conn.Write(input); err != nil {
		return err
	}
	for i := 0; i < count; i++ {
		var size [2]byte
		if _, err := io.ReadFull(conn, size[:]); err != nil {
			return err
		}
		answer := make([]byte, binary.BigEndian.Uint16(size[:]))
		if _, err := io.ReadFull(conn, answer); err != nil {
			return err
		}
		if _, err := out.Write(append(size[:], answer...)); err != nil {
			return err
		}
	}
	return nil
}

// load reads DIR/config.json; a bad one leaves every name refused. Writes DIR/loaded.
func (r *resolver) load() {
	data, err := os.ReadFile(filepath.Join(r.dir, "config.json"))
	var cfg *dnsConfig
	if err == nil {
		cfg, err = parseConfig(data)
	}
	status := ""
	if err != nil {
		cfg = &dnsConfig{Generation: "none", TTLMin: 1, TTLMax: 1}
		status = "error: " + strings.ReplaceAll(err.Error(), "\n", " ")
	} else {
		status = cfg.Generation
	}
	r.flowsMu.Lock()
	r.mu.Lock()
	r.cfg = cfg
	r.mu.Unlock()
	// Loaded means switched: nothing the gate let through stays open against it.
	r.cutFlows(cfg)
	r.flowsMu.Unlock()
	writeAtomic(filepath.Join(r.dir, "loaded"), status+"\n")
}

func writeAtomic(path, text string) {
	tmp := path + ".tmp"
	if os.WriteFile(tmp, []byte(text), 0o600) == nil {
		_ = os.Rename(tmp, path)
	}
}

func (r *resolver) serveUDP(conn *net.UDPConn) {
	buf := make([]byte, 65535)
	for {
		n, from, err := conn.ReadFromUDP(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		query := append([]byte(nil), buf[:n]...)
		select {
		case r.slots <- struct{}{}:
		default:
			continue // overloaded: dropped, the client retries
		}
		go func() {
			defer func() { <-r.slots }()
			if out := r.answer(query, true); out != nil {
				_, _ = conn.WriteToUDP(out, from)
			}
		}()
	}
}

// serveTCP: length-framed queries on each connection until it idles out.
func (r *resolver) serveTCP(conn net.Conn) {
	for {
		_ = conn.SetDeadline(time.Now().Add(tcpIdle))
		var size [2]byte
		if _, err := io.ReadFull(conn, size[:]); err != nil {
			return
		}
		query := make([]byte, binary.BigEndian.Uint16(size[:]))
		if _, err := io.ReadFull(conn, query); err != nil {
			return
		}
		out := r.answer(query, false)
		if out == nil {
			return
		}
		framed := make([]byte, 2+len(out))
		binary.BigEndian.PutUint16(framed, uint16(len(out)))
		copy(framed[2:], out)
		if _, err := conn.Write(framed); err != nil {
			return
		}
	}
}

// serveConns: each accepted connection handled in its own goroutine while one of `slots`
// is free (else closed at once), closed after, a panic confined to it.
func serveConns(listener net.Listener, slots chan struct{}, handle func(net.Conn)) {
	for {
		conn, err := listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			conn.Close()
			continue
		}
		go func() {
			defer func() { <-slots }()
			defer conn.Close()
			defer func() { _ = recover() }()
			handle(conn)
		}()
	}
}

// mustListen: a TCP listener on addr, or the resolver exits (its start then fails).
func mustListen(addr string) net.Listener {
	listener, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "corral-dns: %v\n", err)
		os.Exit(1)
	}
	return listener
}

func dnsMain(dir string) {
	udpAddr, _ := net.ResolveUDPAddr("udp", dnsListen)
	udp, err := net.ListenUDP("udp", udpAddr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "corral-dns: %v\n", err)
		os.Exit(1)
	}
	tcp := mustListen(dnsListen)
	// The name gate's ports, taken before the sandbox can: one it holds fails the start.
	tlsGate, httpGate := mustListen(gateTLS), mustListen(gateHTTP)
	r := &resolver{dir: dir, slots: make(chan struct{}, maxInflight), addSets: ipsetAdd, ask: askUpstream}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	signal.Ignore(syscall.SIGPIPE)
	r.load()
	writeAtomic(filepath.Join(dir, "pid"), fmt.Sprintf("%d\n", os.Getpid()))
	go r.serveUDP(udp)
	go serveConns(tcp, r.slots, r.serveTCP)
	// A refusal tells the sandbox nothing: its connection just closes.
	go serveConns(tlsGate, gateSlots, func(c net.Conn) { _ = r.serveTLS(c) })
	go serveConns(httpGate, gateSlots, func(c net.Conn) { _ = r.serveHTTP(c) })
	for range hup {
		r.load()
	}
}
