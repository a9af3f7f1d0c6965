// corral's name gate: part of the resolver (`--dns DIR`, in the holder), for allowlists
// that name hosts. corral's rules DNAT every TCP connection the sandbox opens to port 443
// or 80 of an address only a hostname entry admits (see network/gate.py) to this
// process, on gateTLS or gateHTTP of 127.0.0.54. A connection goes on to its original
// destination (read with SO_ORIGINAL_DST, from a socket carrying the upstream mark, so
// still under the policy's address rules) only when the name it asks for is one the
// policy allows on that port:
//
//   - 443: the TLS ClientHello's server_name. No SNI, more than one name, a name outside
//     [a-z0-9_-] labels, or an encrypted_client_hello extension (the real name hidden
//     behind the outer one) is refused. After the hello the bytes are opaque: a Host
//     inside TLS is not seen (domain fronting over TLS is the server's to refuse).
//   - 80: one HTTP/1.x request per connection, its head parsed strictly in one pass
//     (CRLF line ends and nowhere else a CR, LF, NUL or other control byte, no folded
//     lines, tokens for names, exactly one Host, an absolute-form target's host checked
//     too, one framing), and sent on with the client's Connection header replaced by
//     `Connection: close`: a server that reads bytes the gate took for a body (or
//     anything after the request) as another request would let that one front a name;
//     told to close, it reads no other. Bytes the client sends after the request (a
//     pipelined one) close the connection. CONNECT, HTTP/2 prior knowledge and anything
//     unparsable close it too. An Upgrade request (a websocket; never h2c) has no body and
//     keeps its Connection header; the bytes go opaque only when the server answered 101.
//
// Every byte the sandbox sends is hostile: reads are bounded (a head in bytes, per line
// and in all, and in time), and a refused or failed connection is closed with nothing
// sent upstream. Each connection let through is held as a flow with the names it was
// let through for: a new policy (load) cuts every flow it does not allow before it
// counts as loaded, so a switch leaves nothing open that it would refuse now.
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

const (
	gateTLS  = "127.0.0.54:10443"
	gateHTTP = "127.0.0.54:10080"
	// a ClientHello, or an HTTP request head, larger than this is refused
	maxHello  = 64 << 10
	maxHead   = 32 << 10
	maxLine   = 8 << 10
	helloIdle = 10 * time.Second
	// SO_ORIGINAL_DST (linux/netfilter_ipv4.h)
	soOriginalDst = 80
	extServerName = 0
	extECH        = 0xfe0d
	// connections through the gate at once, per sandbox (apart from the resolver's slots:
	// a long download must not starve lookups)
	maxGateConns = 1024
)

var gateSlots = make(chan struct{}, maxGateConns)

var errRefused = errors.New("refused")

// allows: whether a hostname entry of the policy admits `name` on `port`.
func (c *dnsConfig) allows(name string, port int) bool {
	name, ok := normalName(name)
	if !ok {
		return false
	}
	for _, e := range c.matches(name) {
		if e.Port == 0 || e.Port == port {
			return true
		}
	}
	return false
}

// originalDst: where the sandbox meant to connect, before corral's DNAT.
func originalDst(conn net.Conn) (*net.TCPAddr, error) {
	tcp, ok := conn.(*net.TCPConn)
	if !ok {
		return nil, errors.New("not TCP")
	}
	raw, err := tcp.SyscallConn()
	if err != nil {
		return nil, err
	}
	var addr syscall.RawSockaddrInet4
	var serr error
	err = raw.Control(func(fd uintptr) {
		size := uint32(unsafe.Sizeof(addr))
		_, _, errno := syscall.Syscall6(syscall.SYS_GETSOCKOPT, fd, syscall.IPPROTO_IP,
			soOriginalDst, uintptr(unsafe.Pointer(&addr)), uintptr(unsafe.Pointer(&size)), 0)
		if errno != 0 {
			serr = errno
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return nil, err
	}
	port := int(addr.Port>>8 | addr.Port<<8&0xff00)
	return &net.TCPAddr{IP: net.IP(addr.Addr[:]).To4(), Port: port}, nil
}

// upstreamOf: the original destination, dialled with the mark; never loopback (a
// connection made straight to the gate has itself as its destination).
func (r *resolver) upstreamOf(conn net.Conn, port int) (net.Conn, error) {
	dst, err := originalDst(conn)
	if err != nil {
		return nil, err
	}
	if dst.IP == nil || dst.IP.IsLoopback() || dst.IP.IsUnspecified() || dst.Port != port {
		return nil, fmt.Errorf("%v is not a destination the gate serves", dst)
	}
	return markedDialer(r.config().Mark).Dial("tcp", dst.String())
}

// readHello: the TLS records that carry the whole ClientHello (as sent) and the hello
// itself, reassembled across records.
func readHello(br *bufio.Reader) (raw []byte, hello []byte, err error) {
	for {
		header, err := br.Peek(5)
		if err != nil {
			return nil, nil, err
		}
		if header[0] != 0x16 || header[1] != 3 {
			return nil, nil, errors.New("not a TLS handshake")
		}
		size := int(binary.BigEndian.Uint16(header[3:5]))
		if size == 0 || len(raw)+5+size > maxHello {
			return nil, nil, errors.New("bad record size")
		}
		record := make([]byte, 5+size)
		if _, err := io.ReadFull(br, record); err != nil {
			return nil, nil, err
		}
		raw = append(raw, record...)
		hello = append(hello, record[5:]...)
		if len(hello) >= 4 {
			if hello[0] != 1 {
				return nil, nil, errors.New("not a ClientHello")
			}
			want := 4 + (int(hello[1])<<16 | int(hello[2])<<8 | int(hello[3]))
			if want > maxHello {
				return nil, nil, errors.New("ClientHello too large")
			}
			if len(hello) >= want {
				return raw, hello[4:want], nil
			}
		}
	}
}

// helloName: the one host_name of a ClientHello body's server_name extension; an error
// where there is none, several, or an encrypted_client_hello.
func helloName(body []byte) (string, error) {
	rd := reader{b: body}
	rd.skip(2 + 32)        // legacy_version, random
	rd.skip(int(rd.u8()))  // legacy_session_id
	rd.skip(int(rd.u16())) // cipher_suites
	rd.skip(int(rd.u8()))  // legacy_compression_methods
	exts := reader{b: rd.take(int(rd.u16()))}
	if rd.bad || exts.bad {
		return "", errors.New("malformed ClientHello")
	}
	name := ""
	seen := map[uint16]bool{}
	for len(exts.b) > 0 && !exts.bad {
		kind, data := exts.u16(), exts.take(int(exts.u16()))
		if seen[kind] {
			return "", errors.New("an extension twice")
		}
		seen[kind] = true
		switch kind {
		case extECH:
			return "", errors.New("encrypted_client_hello: the name is hidden")
		case extServerName:
			list := reader{b: data}
			names := reader{b: list.take(int(list.u16()))}
			for len(names.b) > 0 && !names.bad {
				kind, host := names.u8(), names.take(int(names.u16()))
				if kind != 0 {
					continue
				}
				if name != "" {
					return "", errors.New("more than one host_name")
				}
				name = string(host)
			}
			if list.bad || names.bad || len(list.b) > 0 {
				return "", errors.New("malformed server_name")
			}
		}
	}
	if exts.bad {
		return "", errors.New("malformed extensions")
	}
	if name == "" {
		return "", errors.New("no server_name")
	}
	return name, nil
}

type reader struct {
	b   []byte
	bad bool
}

func (r *reader) take(n int) []byte {
	if r.bad || n < 0 || n > len(r.b) {
		r.bad = true
		return nil
	}
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *reader) skip(n int) { r.take(n) }

func (r *reader) u8() uint8 {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if b := r.take(2); b != nil {
		return binary.BigEndian.Uint16(b)
	}
	return 0
}

func (r *resolver) serveTLS(conn net.Conn) error {
	_ = conn.SetReadDeadline(time.Now().Add(helloIdle))
	br := bufio.NewReaderSize(conn, 16<<10)
	raw, hello, err := readHello(br)
	if err != nil {
		return err
	}
	name, err := helloName(hello)
	if err != nil {
		return err
	}
	f := &flow{port: 443, names: []string{name}, client: conn}
	up, err := r.open(f)
	if err != nil {
		return err
	}
	defer r.forget(f)
	_ = conn.SetReadDeadline(time.Time{})
	if _, err := up.Write(raw); err != nil {
		return err
	}
	splice(conn, br, up, up)
	return nil
}

// flow: a connection the gate let through, with the names it was let through for.
type flow struct {
	port   int
	names  []string
	client net.Conn
	up     net.Conn
	cut    bool
}

// allowsFlow: whether cfg allows every name of f on its port.
func (c *dnsConfig) allowsFlow(f *flow) bool {
	for _, name := range f.names {
		if !c.allows(name, f.port) {
			return false
		}
	}
	return true
}

// open: f's upstream, when the policy in force allows f; f is then held (until forget)
// where a new policy can cut it. Judging and holding are one step under flowsMu, as
// swapping the policy and cutting are in load: no flow is judged by the old policy and
// held after the new one's cuts.
func (r *resolver) open(f *flow) (net.Conn, error) {
	r.flowsMu.Lock()
	if !r.config().allowsFlow(f) {
		r.flowsMu.Unlock()
		return nil, fmt.Errorf("%w: %q on %d", errRefused, f.names, f.port)
	}
	if r.flows == nil {
		r.flows = map[*flow]struct{}{}
	}
	r.flows[f] = struct{}{}
	r.flowsMu.Unlock()
	up, err := r.upstreamOf(f.client, f.port)
	if err != nil {
		r.forget(f)
		return nil, err
	}
	r.flowsMu.Lock()
	defer r.flowsMu.Unlock()
	if f.cut { // a switch while dialling
		up.Close()
		return nil, fmt.Errorf("%w: %q on %d, by a new policy", errRefused, f.names, f.port)
	}
	f.up = up
	return up, nil
}

// forget: f is over (its connections closed by its server).
func (r *resolver) forget(f *flow) {
	r.flowsMu.Lock()
	defer r.flowsMu.Unlock()
	delete(r.flows, f)
	if f.up != nil {
		f.up.Close()
	}
}

// cutFlows: every held flow cfg does not allow, both its connections reset (not closed
// gracefully: nothing still buffered for either side is sent). Called with flowsMu held.
func (r *resolver) cutFlows(cfg *dnsConfig) {
	for f := range r.flows {
		if cfg.allowsFlow(f) {
			continue
		}
		f.cut = true
		for _, c := range []net.Conn{f.client, f.up} {
			if tcp, ok := c.(*net.TCPConn); ok {
				_ = tcp.SetLinger(0)
			}
			if c != nil {
				c.Close()
			}
		}
		delete(r.flows, f)
	}
}

// splice copies both ways until either side ends, then closes both.
func splice(client net.Conn, fromClient io.Reader, up net.Conn, fromUp io.Reader) {
	var once sync.Once
	end := func() { once.Do(func() { client.Close(); up.Close() }) }
	go func() { _, _ = io.Copy(client, fromUp); end() }()
	_, _ = io.Copy(up, fromClient)
	end()
}

// httpRequest: one request head as the gate sends it on, with what it decides by.
type httpRequest struct {
	head    []byte
	hosts   []string
	length  int64 // -1: none
	chunked bool
	upgrade bool
	// while parsing: the Host fields, Content-Length values, Connection lines and the
	// other lines, as sent
	hostFields int
	lengths    []string
	connection [][]byte
	fields     [][]byte
}

// readLine: one line ending in CRLF (a bare LF is refused: smuggling lives there).
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) || len(line) > limit {
		return nil, errors.New("line too long")
	}
	if err != nil {
		return nil, err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, errors.New("a line not ending in CRLF")
	}
	return append([]byte(nil), line...), nil
}

func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("\"(),/:;<=>?@[\\]{}", c) >= 0 {
			return false
		}
	}
	return true
}

// fieldText: whether s holds only what a field value may (RFC 9110 §5.5: visible ASCII,
// SP, HTAB, obs-text). A bare CR, a NUL or another control byte is refused, not
// replaced: a server that ends a line at a bare CR would read a field the gate never saw.
func fieldText(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// fieldLine: a header or trailer line's name, lowercased, and its value, trimmed. The
// name is a token: no space before the colon, no folded line (one starting with SP).
func fieldLine(line []byte) (string, string, error) {
	text := string(line[:len(line)-2])
	colon := strings.IndexByte(text, ':')
	if colon <= 0 || !isToken(text[:colon]) || !fieldText(text[colon+1:]) {
		return "", "", errors.New("a malformed header line")
	}
	return strings.ToLower(text[:colon]), strings.Trim(text[colon+1:], " \t"), nil
}

// requestLine: the request line's version, its absolute-form host taken into req.hosts.
func (req *httpRequest) requestLine(line []byte) (string, error) {
	parts := strings.Split(string(line[:len(line)-2]), " ")
	if len(parts) != 3 || !isToken(parts[0]) || parts[1] == "" ||
		(parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0") {
		return "", errors.New("not an HTTP/1.x request line")
	}
	target := parts[1]
	for i := 0; i < len(target); i++ {
		if target[i] <= ' ' || target[i] >= 0x7f {
			return "", errors.New("a request target with a control byte or space")
		}
	}
	if parts[0] == "CONNECT" {
		return "", errors.New("CONNECT")
	}
	if !strings.HasPrefix(target, "/") && target != "*" {
		lower := strings.ToLower(target)
		if !strings.HasPrefix(lower, "http://") {
			return "", errors.New("a request target neither origin- nor http absolute-form")
		}
		authority := target[len("http://"):]
		if i := strings.IndexAny(authority, "/?#"); i >= 0 {
			authority = authority[:i]
		}
		req.hosts = append(req.hosts, authority)
	}
	return parts[2], nil
}

// field: one header line, noted; the lines sent on are kept apart from Connection's.
func (req *httpRequest) field(line []byte) error {
	name, value, err := fieldLine(line)
	if err != nil {
		return err
	}
	switch name {
	case "host":
		req.hostFields++
		req.hosts = append(req.hosts, value)
	case "content-length":
		req.lengths = append(req.lengths, value)
	case "transfer-encoding":
		if !strings.EqualFold(value, "chunked") || req.chunked {
			return fmt.Errorf("transfer-encoding %q", value)
		}
		req.chunked = true
	case "upgrade":
		// h2c would carry later requests (and their :authority) out of sight
		if strings.Contains(strings.ToLower(value), "h2c") {
			return errors.New("an upgrade to h2c")
		}
		req.upgrade = true
	case "connection":
		req.connection = append(req.connection, line)
		return nil
	}
	req.fields = append(req.fields, line)
	return nil
}

// framing: the one framing of the body, or an error where a server could see another.
func (req *httpRequest) framing(version string) error {
	if req.hostFields != 1 {
		return fmt.Errorf("%d Host headers", req.hostFields)
	}
	if req.chunked && len(req.lengths) > 0 {
		return errors.New("both chunked and Content-Length")
	}
	if req.chunked && version == "HTTP/1.0" { // RFC 9112 §6.1: faulty framing
		return errors.New("chunked in HTTP/1.0")
	}
	for _, value := range req.lengths {
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil || n < 0 || value[0] == '+' || (req.length >= 0 && n != req.length) {
			return fmt.Errorf("content-length %q", value)
		}
		req.length = n
	}
	if req.upgrade && (req.chunked || req.length > 0) {
		return errors.New("an Upgrade request with a body")
	}
	return nil
}

// readRequest: one request head, read in one pass within maxHead bytes, and the head to
// send on: an Upgrade's as sent, any other's with `Connection: close` for its
// Connection lines.
func readRequest(br *bufio.Reader) (*httpRequest, error) {
	req := &httpRequest{length: -1}
	first, err := readLine(br, maxLine)
	if err != nil {
		return nil, err
	}
	version, err := req.requestLine(first)
	if err != nil {
		return nil, err
	}
	for size := len(first); ; {
		line, err := readLine(br, maxLine)
		if err != nil {
			return nil, err
		}
		if size += len(line); size > maxHead {
			return nil, errors.New("request head too large")
		}
		if len(line) == 2 {
			break
		}
		if err := req.field(line); err != nil {
			return nil, err
		}
	}
	if err := req.framing(version); err != nil {
		return nil, err
	}
	connection := [][]byte{[]byte("Connection: close\r\n")}
	if req.upgrade {
		connection = req.connection
	}
	parts := append(append([][]byte{first}, req.fields...), connection...)
	req.head = bytes.Join(append(parts, []byte("\r\n")), nil)
	return req, nil
}

// hostName: the name of a Host value or authority (no userinfo, an optional port).
func hostName(authority string) (string, bool) {
	if strings.ContainsAny(authority, "@[] \t") {
		return "", false
	}
	host := authority
	if i := strings.LastIndexByte(authority, ':'); i >= 0 {
		if _, err := strconv.ParseUint(authority[i+1:], 10, 16); err != nil {
			return "", false
		}
		host = authority[:i]
	}
	return host, host != ""
}

// copyBody: the request's body, as framed, from client to upstream.
func copyBody(br *bufio.Reader, up io.Writer, req *httpRequest) error {
	if req.length > 0 {
		_, err := io.CopyN(up, br, req.length)
		return err
	}
	if !req.chunked {
		return nil
	}
	for {
		line, err := readLine(br, maxLine)
		if err != nil {
			return err
		}
		size, err := chunkLine(line)
		if err != nil {
			return err
		}
		if _, err := up.Write(line); err != nil {
			return err
		}
		if size == 0 {
			return copyTrailers(br, up)
		}
		if _, err := io.CopyN(up, br, size); err != nil {
			return err
		}
		end, err := readLine(br, 2)
		if err != nil || len(end) != 2 {
			return errors.New("a chunk not followed by CRLF")
		}
		if _, err := up.Write(end); err != nil {
			return err
		}
	}
}

// chunkLine: a chunk line's size; its extensions hold no control byte.
func chunkLine(line []byte) (int64, error) {
	digits, ext, _ := strings.Cut(string(line[:len(line)-2]), ";")
	size, err := strconv.ParseUint(digits, 16, 62)
	if err != nil || digits == "" || !fieldText(ext) {
		return 0, fmt.Errorf("chunk size %q", digits)
	}
	return int64(size), nil
}

// copyTrailers: the trailer lines, each a well-formed field, up to the empty line.
func copyTrailers(br *bufio.Reader, up io.Writer) error {
	for size := 0; ; {
		line, err := readLine(br, maxLine)
		if err != nil {
			return err
		}
		if size += len(line); size > maxHead {
			return errors.New("trailers too large")
		}
		if len(line) > 2 {
			if _, _, err := fieldLine(line); err != nil {
				return err
			}
		}
		if _, err := up.Write(line); err != nil {
			return err
		}
		if len(line) == 2 {
			return nil
		}
	}
}

func (r *resolver) serveHTTP(conn net.Conn) error {
	_ = conn.SetReadDeadline(time.Now().Add(helloIdle))
	br := bufio.NewReaderSize(conn, maxLine+16)
	req, err := readRequest(br)
	if err != nil {
		return err
	}
	f := &flow{port: 80, client: conn}
	for _, authority := range req.hosts {
		host, ok := hostName(authority)
		if !ok {
			return fmt.Errorf("%w: %q on 80", errRefused, authority)
		}
		f.names = append(f.names, host)
	}
	up, err := r.open(f)
	if err != nil {
		return err
	}
	defer r.forget(f)
	_ = conn.SetReadDeadline(time.Time{})
	if _, err := up.Write(req.head); err != nil {
		return err
	}
	if err := copyBody(br, up, req); err != nil {
		return err
	}
	fromUp := bufio.NewReader(up)
	if req.upgrade {
		status, err := fromUp.Peek(12)
		if err != nil || !bytes.HasPrefix(status, []byte("HTTP/1.")) || string(status[9:12]) != "101" {
			return errors.New("the server did not upgrade")
		}
		splice(conn, br, up, fromUp)
		return nil
	}
	answered := make(chan struct{})
	go func() { _, _ = io.Copy(conn, fromUp); conn.Close(); close(answered) }()
	// One request per connection: a byte after it (a pipelined request) ends it at once.
	if _, err := br.ReadByte(); errors.Is(err, io.EOF) {
		<-answered
	}
	return nil
}
