package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// clientHello: the records crypto/tls sends first for `name` ("" sends no SNI).
func clientHello(t *testing.T, name string) []byte {
	t.Helper()
	client, server := net.Pipe()
	go func() {
		conf := &tls.Config{ServerName: name, InsecureSkipVerify: true}
		_ = tls.Client(client, conf).Handshake()
	}()
	_ = server.SetReadDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(server)
	raw, _, err := readHello(br)
	if err != nil {
		t.Fatal(err)
	}
	server.Close()
	client.Close()
	return raw
}

// hello: a ClientHello body with these extensions (type, data), in one record.
func hello(exts ...[]byte) []byte {
	body := append(make([]byte, 34), 0)         // version, random, no session id
	body = append(body, 0, 2, 0x13, 0x01, 1, 0) // one suite, null compression
	all := bytes.Join(exts, nil)
	body = binary.BigEndian.AppendUint16(body, uint16(len(all)))
	body = append(body, all...)
	msg := append([]byte{1, 0, byte(len(body) >> 8), byte(len(body))}, body...)
	return append([]byte{0x16, 3, 1, byte(len(msg) >> 8), byte(len(msg))}, msg...)
}

func ext(kind uint16, data []byte) []byte {
	out := binary.BigEndian.AppendUint16(nil, kind)
	out = binary.BigEndian.AppendUint16(out, uint16(len(data)))
	return append(out, data...)
}

func sni(names ...string) []byte {
	var list []byte
	for _, n := range names {
		list = append(list, 0)
		list = binary.BigEndian.AppendUint16(list, uint16(len(n)))
		list = append(list, n...)
	}
	return ext(extServerName, append(binary.BigEndian.AppendUint16(nil, uint16(len(list))), list...))
}

func nameOf(records []byte) (string, error) {
	_, body, err := readHello(bufio.NewReader(bytes.NewReader(records)))
	if err != nil {
		return "", err
	}
	return helloName(body)
}

func TestHelloNameOfARealClientHello(t *testing.T) {
	name, err := nameOf(clientHello(t, "a.allowed.test"))
	if err != nil || name != "a.allowed.test" {
		t.Fatalf("got %q, %v", name, err)
	}
	if name, err := nameOf(clientHello(t, "")); err == nil {
		t.Fatalf("a hello without SNI gave %q", name)
	}
}

func TestHelloSplitAcrossRecordsIsReassembled(t *testing.T) {
	records := hello(sni("a.allowed.test"))
	msg := records[5:]
	split := append([]byte{0x16, 3, 1, 0, 10}, msg[:10]...)
	rest := msg[10:]
	split = append(split, 0x16, 3, 1, byte(len(rest)>>8), byte(len(rest)))
	split = append(split, rest...)
	raw, body, err := readHello(bufio.NewReader(bytes.NewReader(split)))
	if err != nil || !bytes.Equal(raw, split) {
		t.Fatalf("raw %d bytes of %d, %v", len(raw), len(split), err)
	}
	if name, err := helloName(body); name != "a.allowed.test" || err != nil {
		t.Fatalf("got %q, %v", name, err)
	}
}

func TestHellosThatHideOrDoubleTheNameAreRefused(t *testing.T) {
	cases := map[string][]byte{
		"ech":           hello(sni("a.allowed.test"), ext(extECH, []byte{0, 1, 2})),
		"two names":     hello(sni("a.allowed.test", "x.other.test")),
		"sni twice":     hello(sni("a.allowed.test"), sni("x.other.test")),
		"no sni":        hello(ext(10, []byte{0, 2, 0, 29})),
		"truncated ext": hello(ext(extServerName, []byte{0, 9, 0}), nil),
	}
	for label, records := range cases {
		if name, err := nameOf(records); err == nil {
			t.Errorf("%s: accepted as %q", label, name)
		}
	}
	if _, err := nameOf([]byte("GET / HTTP/1.1\r\n\r\n")); err == nil {
		t.Error("plain HTTP on 443 passed for TLS")
	}
}

func TestTheGateAllowsNamesByPort(t *testing.T) {
	cfg := &dnsConfig{Entries: []dnsEntry{
		{Name: "allowed.test", Wildcard: true, Port: 0},
		{Name: "web.test", Port: 80},
	}}
	for _, c := range []struct {
		name string
		port int
		want bool
	}{
		{"a.allowed.test", 443, true},
		{"A.Allowed.Test.", 80, true},
		{"allowed.test", 443, false},
		{"web.test", 80, true},
		{"web.test", 443, false},
		{"a.allowed.test.evil", 443, false},
		{"a.allowed.test\x00", 443, false},
	} {
		if got := cfg.allows(c.name, c.port); got != c.want {
			t.Errorf("allows(%q, %d) = %v", c.name, c.port, got)
		}
	}
}

func parseRequest(text string) (*httpRequest, error) {
	return readRequest(bufio.NewReader(strings.NewReader(text)))
}

func TestRequestsAreParsedStrictly(t *testing.T) {
	req, err := parseRequest("GET http://a.allowed.test/x HTTP/1.1\r\nHost: b.allowed.test:80\r\n" +
		"Content-Length: 3\r\n\r\nabc")
	if err != nil || len(req.hosts) != 2 || req.hosts[0] != "a.allowed.test" ||
		req.hosts[1] != "b.allowed.test:80" || req.length != 3 {
		t.Fatalf("%+v %v", req, err)
	}
	for label, text := range map[string]string{
		"two hosts":    "GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n",
		"no host":      "GET / HTTP/1.1\r\n\r\n",
		"bare LF":      "GET / HTTP/1.1\nHost: a.test\n\n",
		"folded":       "GET / HTTP/1.1\r\nHost: a.test\r\n x: y\r\n\r\n",
		"te and cl":    "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n",
		"odd te":       "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
		"two lengths":  "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
		"connect":      "CONNECT a.test:443 HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"h2":           "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
		"space header": "GET / HTTP/1.1\r\nHost : a.test\r\n\r\n",
		"https target": "GET https://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"h2c upgrade":  "GET / HTTP/1.1\r\nHost: a.test\r\nUpgrade: h2c\r\n\r\n",
		// a server that ends a line at a bare CR reads the Host after it (issue 40)
		"bare CR":        "GET / HTTP/1.1\r\nX-Pad: 1\rHost: x.other.test\r\nHost: a.test\r\n\r\n",
		"CR in host":     "GET / HTTP/1.1\r\nHost: a.test\rx\r\n\r\n",
		"NUL in value":   "GET / HTTP/1.1\r\nHost: a.test\r\nX: a\x00b\r\n\r\n",
		"NUL in name":    "GET / HTTP/1.1\r\nHost: a.test\r\nX\x00Y: 1\r\n\r\n",
		"other CTL":      "GET / HTTP/1.1\r\nHost: a.test\r\nX: \x0b1\r\n\r\n",
		"DEL":            "GET / HTTP/1.1\r\nHost: a.test\r\nX: \x7f\r\n\r\n",
		"bare LF inside": "GET / HTTP/1.1\r\nX: 1\nHost: x.other.test\r\nHost: a.test\r\n\r\n",
		"tab folded":     "GET / HTTP/1.1\r\nHost: a.test\r\n\tx: y\r\n\r\n",
		"tab before :":   "GET / HTTP/1.1\r\nHost\t: a.test\r\n\r\n",
		"CR in target":   "GET /\rHost:x.other.test HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"tab in target":  "GET /\tx HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"two spaces":     "GET  / HTTP/1.1\r\nHost: a.test\r\n\r\n",
		"1.0 chunked":    "POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
		"te twice":       "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
		"signed length":  "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n",
		"length list":    "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1, 1\r\n\r\n",
		"upgrade body":   "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nContent-Length: 5\r\n\r\n",
		"head too large": "GET / HTTP/1.1\r\nHost: a\r\n" + strings.Repeat("X: "+strings.Repeat("y", 1000)+"\r\n", 40) + "\r\n",
		"line too long":  "GET / HTTP/1.1\r\nHost: a\r\nX: " + strings.Repeat("y", maxLine) + "\r\n\r\n",
		"no end of head": "GET / HTTP/1.1\r\nHost: a\r\n",
	} {
		if req, err := parseRequest(text); err == nil {
			t.Errorf("%s: accepted %+v", label, req)
		}
	}
}

func TestAChunkedBodyIsFollowedToTheNextRequest(t *testing.T) {
	text := "POST / HTTP/1.1\r\nHost: a.allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n" +
		"3;x=y\r\nabc\r\n0\r\nTrailer: 1\r\n\r\n" +
		"GET / HTTP/1.1\r\nHost: x.other.test\r\n\r\n"
	br := bufio.NewReader(strings.NewReader(text))
	req, err := readRequest(br)
	if err != nil {
		t.Fatal(err)
	}
	var sent bytes.Buffer
	if err := copyBody(br, &sent, req); err != nil {
		t.Fatal(err)
	}
	if sent.String() != "3;x=y\r\nabc\r\n0\r\nTrailer: 1\r\n\r\n" {
		t.Fatalf("body sent: %q", sent.String())
	}
	next, err := readRequest(br)
	if err != nil || len(next.hosts) != 1 || next.hosts[0] != "x.other.test" {
		t.Fatalf("the second request's host is not seen: %+v %v", next, err)
	}
	if _, ok := hostName("user@a.test"); ok {
		t.Error("userinfo accepted in a Host")
	}
	if h, ok := hostName("a.test:8080"); !ok || h != "a.test" {
		t.Errorf("hostName = %q", h)
	}
}

func TestABodyEndsWhereItsFramingSaysOrIsRefused(t *testing.T) {
	head := "POST / HTTP/1.1\r\nHost: a.allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n"
	for label, body := range map[string]string{
		"CR in a chunk extension": "3;x=\ry\r\nabc\r\n0\r\n\r\n",
		"CR in a trailer":         "3\r\nabc\r\n0\r\nT: 1\rHost: x.other.test\r\n\r\n",
		"folded trailer":          "3\r\nabc\r\n0\r\n x: y\r\n\r\n",
		"hex prefix":              "0x3\r\nabc\r\n0\r\n\r\n",
		"short chunk":             "3\r\nabcd\r\n0\r\n\r\n",
	} {
		br := bufio.NewReader(strings.NewReader(head + body))
		req, err := readRequest(br)
		if err != nil {
			t.Fatal(err)
		}
		if err := copyBody(br, &bytes.Buffer{}, req); err == nil {
			t.Errorf("%s: the body passed", label)
		}
	}
}

func TestTheHeadSentOnAsksTheServerToClose(t *testing.T) {
	req, err := parseRequest("GET / HTTP/1.1\r\nHost: a.allowed.test\r\nConnection: keep-alive\r\n" +
		"X: 1\r\nconnection: Keep-Alive, x\r\n\r\n")
	if err != nil {
		t.Fatal(err)
	}
	want := "GET / HTTP/1.1\r\nHost: a.allowed.test\r\nX: 1\r\nConnection: close\r\n\r\n"
	if string(req.head) != want {
		t.Fatalf("sent on: %q", req.head)
	}
	ws := "GET /ws HTTP/1.1\r\nHost: a.allowed.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n"
	if req, err := parseRequest(ws); err != nil || string(req.head) != ws {
		t.Fatalf("an Upgrade sent on as %q, %v", req.head, err)
	}
}

// loopbackPair: the two ends of one TCP connection on loopback.
func loopbackPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	listener, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer listener.Close()
	near, err := net.Dial("tcp", listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	far, err := listener.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { near.Close(); far.Close() })
	return near, far
}

// stillOpen: whether `far` (the sandbox's or the server's end of a flow's connection)
// neither ended nor was reset.
func stillOpen(t *testing.T, far net.Conn) bool {
	t.Helper()
	_ = far.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	_, err := far.Read(make([]byte, 1))
	var timeout net.Error
	return errors.As(err, &timeout) && timeout.Timeout()
}

func TestASwitchCutsTheFlowsItNoLongerAllowsBeforeItIsLoaded(t *testing.T) {
	both := testConfig()
	both.Entries = append(both.Entries, dnsEntry{Name: "web.test", Port: 80, Set4: "w4", Set6: "w6"})
	r := &resolver{cfg: both, dir: t.TempDir()}
	flows := map[string]*flow{
		"a.allowed.test": {port: 443, names: []string{"a.allowed.test"}},
		"b.allowed.test": {port: 443, names: []string{"b.allowed.test"}},
		"web.test":       {port: 80, names: []string{"web.test"}},
	}
	far := map[string][2]net.Conn{}
	for name, f := range flows {
		client, sandbox := loopbackPair(t)
		up, server := loopbackPair(t)
		f.client, f.up = client, up
		far[name] = [2]net.Conn{sandbox, server}
	}
	r.flows = map[*flow]struct{}{}
	for _, f := range flows {
		r.flows[f] = struct{}{}
	}
	// the new policy: only b.allowed.test, and web.test on 443 (not on 80)
	next := testConfig()
	next.Generation = "g2"
	next.Entries = []dnsEntry{
		{Name: "b.allowed.test", Set4: "b4", Set6: "b6"},
		{Name: "web.test", Port: 443, Set4: "w4", Set6: "w6"},
	}
	data, _ := json.Marshal(next)
	if err := os.WriteFile(filepath.Join(r.dir, "config.json"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	r.load()
	if loaded, _ := os.ReadFile(filepath.Join(r.dir, "loaded")); string(loaded) != "g2\n" {
		t.Fatalf("loaded %q", loaded)
	}
	for name, ends := range far {
		want := name == "b.allowed.test"
		for _, end := range ends {
			if got := stillOpen(t, end); got != want {
				t.Errorf("%s: open after the switch = %v", name, got)
			}
		}
	}
	if len(r.flows) != 1 || !flows["a.allowed.test"].cut || flows["b.allowed.test"].cut {
		t.Errorf("held after the switch: %d flows", len(r.flows))
	}
}

func TestAHeadDrippedPastItsTimeIsRefusedInTime(t *testing.T) {
	t.Parallel()
	client, gate := loopbackPair(t)
	go func() {
		_, _ = client.Write([]byte("GET / HTTP/1.1\r\nHost: a.allowed.test\r\n"))
		for i := 0; i < 40; i++ { // a line every 0.5 s: 20 s of head, never ended
			time.Sleep(500 * time.Millisecond)
			if _, err := client.Write([]byte("X: 1\r\n")); err != nil {
				return
			}
		}
	}()
	started := time.Now()
	err := (&resolver{cfg: testConfig()}).serveHTTP(gate)
	var timeout net.Error
	if !errors.As(err, &timeout) || !timeout.Timeout() || time.Since(started) > helloIdle+time.Second {
		t.Fatalf("after %v: %v", time.Since(started), err)
	}
}
