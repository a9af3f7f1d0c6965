package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math/rand"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

func testConfig() *dnsConfig {
	return &dnsConfig{
		Generation: "g1",
		Upstream:   []string{"192.0.2.53"},
		Mark:       7,
		TTLMin:     60,
		TTLMax:     3600,
		Entries: []dnsEntry{
			{Name: "allowed.test", Wildcard: true, Set4: "s-any-4", Set6: "s-any-6"},
			{Name: "exact.test", Set4: "s-443-4", Set6: "s-443-6"},
		},
	}
}

func encodeName(name string) []byte {
	var out []byte
	for _, label := range strings.Split(name, ".") {
		out = append(out, byte(len(label)))
		out = append(out, label...)
	}
	return append(out, 0)
}

func makeQuery(id uint16, name string, qtype uint16) []byte {
	msg := make([]byte, 12)
	binary.BigEndian.PutUint16(msg[0:2], id)
	binary.BigEndian.PutUint16(msg[2:4], 0x0100)
	binary.BigEndian.PutUint16(msg[4:6], 1)
	msg = append(msg, encodeName(name)...)
	return append(msg, byte(qtype>>8), byte(qtype), 0, 1)
}

// makeAnswer: the query answered with records (owner, type, ttl, rdata), owners written
// out in full, the CNAME rdata as a name.
func makeAnswer(query []byte, records [][4]any) []byte {
	msg := append([]byte(nil), query...)
	msg[2] |= 0x80
	binary.BigEndian.PutUint16(msg[6:8], uint16(len(records)))
	for _, r := range records {
		msg = append(msg, encodeName(r[0].(string))...)
		rtype := r[1].(int)
		var rdata []byte
		if rtype == dnsTypeCNAME {
			rdata = encodeName(r[3].(string))
		} else {
			rdata = r[3].([]byte)
		}
		head := make([]byte, 10)
		binary.BigEndian.PutUint16(head[0:2], uint16(rtype))
		binary.BigEndian.PutUint16(head[2:4], 1)
		binary.BigEndian.PutUint32(head[4:8], uint32(r[2].(int)))
		binary.BigEndian.PutUint16(head[8:10], uint16(len(rdata)))
		msg = append(msg, head...)
		msg = append(msg, rdata...)
	}
	return msg
}

func TestMatching(t *testing.T) {
	cfg := testConfig()
	cases := map[string]int{
		"a.allowed.test":       1,
		"x.y.allowed.test":     1,
		"allowed.test":         0, // the apex is not under its wildcard
		"notallowed.test":      0,
		"allowed.test.evil":    0,
		"exact.test":           1,
		"a.exact.test":         0,
		"a.allowed.test.other": 0,
	}
	for name, want := range cases {
		if got := len(cfg.matches(name)); got != want {
			t.Errorf("%s: %d matches, want %d", name, got, want)
		}
	}
}

func TestParseQueryRefusesConfusingLabels(t *testing.T) {
	// One label "a.allowed" then "test": a name in zone test., not under allowed.test.
	msg := make([]byte, 12)
	binary.BigEndian.PutUint16(msg[4:6], 1)
	msg = append(msg, 9)
	msg = append(msg, "a.allowed"...)
	msg = append(msg, 4)
	msg = append(msg, "test"...)
	msg = append(msg, 0, 0, 1, 0, 1)
	if _, err := parseQuery(msg); err == nil {
		t.Fatal("a label with a dot in it was accepted")
	}
	q, err := parseQuery(makeQuery(1, "A.Allowed.TEST", dnsTypeA))
	if err != nil || q.name != "a.allowed.test" {
		t.Fatalf("got %q %v", q.name, err)
	}
}

type fakeSets struct{ lines []string }

func (f *fakeSets) add(lines []string) error {
	f.lines = append(f.lines, lines...)
	return nil
}

func TestAllowedNameAddsBeforeAnswering(t *testing.T) {
	sets := &fakeSets{}
	asked := 0
	r := &resolver{cfg: testConfig(), addSets: sets.add, ask: func(_ *dnsConfig, q []byte) ([]byte, error) {
		asked++
		return makeAnswer(q, [][4]any{
			{"a.allowed.test", dnsTypeCNAME, 30, "cdn.example"},
			{"cdn.example", dnsTypeA, 5, []byte{192, 0, 2, 10}},
			{"unrelated.example", dnsTypeA, 300, []byte{192, 0, 2, 99}},
			{"cdn.example", dnsTypeAAAA, 100000, []byte{0x20, 1, 0xd, 0xb8, 15: 1}},
		}), nil
	}}
	out := r.answer(makeQuery(9, "a.allowed.test", dnsTypeA), true)
	if asked != 1 || out == nil || binary.BigEndian.Uint16(out[0:2]) != 9 {
		t.Fatalf("asked %d, out %v", asked, out)
	}
	want := []string{"add s-any-4 192.0.2.10 timeout 60", "add s-any-6 2001:db8::1 timeout 3600"}
	if strings.Join(sets.lines, "|") != strings.Join(want, "|") {
		t.Fatalf("sets got %q, want %q", sets.lines, want)
	}
}

func TestOtherNamesAreRefusedWithoutAsking(t *testing.T) {
	r := &resolver{cfg: testConfig(), addSets: (&fakeSets{}).add, ask: func(*dnsConfig, []byte) ([]byte, error) {
		t.Fatal("a refused name went upstream")
		return nil, nil
	}}
	for _, name := range []string{"x.other.test", "allowed.test", "exact.test.allowed"} {
		out := r.answer(makeQuery(3, name, dnsTypeA), true)
		if out == nil || out[3]&0xF != rcodeRefused || out[2]&0x80 == 0 {
			t.Fatalf("%s: %v", name, out)
		}
	}
}

func TestFailuresAreServfailNeverAnAnswer(t *testing.T) {
	query := makeQuery(4, "a.allowed.test", dnsTypeA)
	good := func(_ *dnsConfig, q []byte) ([]byte, error) {
		return makeAnswer(q, [][4]any{{"a.allowed.test", dnsTypeA, 60, []byte{192, 0, 2, 1}}}), nil
	}
	failing := &resolver{cfg: testConfig(), ask: good, addSets: func([]string) error { return errors.New("full") }}
	if out := failing.answer(query, true); out[3]&0xF != rcodeServFail {
		t.Fatalf("set failure answered %v", out)
	}
	forged := &resolver{cfg: testConfig(), addSets: (&fakeSets{}).add, ask: func(_ *dnsConfig, q []byte) ([]byte, error) {
		a, _ := good(nil, q)
		a[1] ^= 1 // another id
		return a, nil
	}}
	if out := forged.answer(query, true); out[3]&0xF != rcodeServFail {
		t.Fatalf("mismatched id answered %v", out)
	}
}

func TestLargeUDPAnswerIsTruncated(t *testing.T) {
	var records [][4]any
	for i := 0; i < 60; i++ {
		records = append(records, [4]any{"a.allowed.test", dnsTypeA, 60, []byte{192, 0, 2, byte(i)}})
	}
	r := &resolver{cfg: testConfig(), addSets: (&fakeSets{}).add, ask: func(_ *dnsConfig, q []byte) ([]byte, error) {
		return makeAnswer(q, records), nil
	}}
	query := makeQuery(5, "a.allowed.test", dnsTypeA)
	if out := r.answer(query, true); len(out) > 512 || out[2]&0x02 == 0 {
		t.Fatalf("UDP answer of %d bytes, TC %v", len(out), out[2]&0x02 != 0)
	}
	if out := r.answer(query, false); len(out) <= 512 {
		t.Fatalf("TCP answer cut to %d bytes", len(out))
	}
}

func TestHostileInputNeverPanics(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	base := makeQuery(1, "a.allowed.test", dnsTypeA)
	answer := makeAnswer(base, [][4]any{{"a.allowed.test", dnsTypeA, 60, []byte{192, 0, 2, 1}}})
	r := &resolver{cfg: testConfig(), addSets: (&fakeSets{}).add}
	for i := 0; i < 20000; i++ {
		var msg []byte
		if i%2 == 0 {
			msg = make([]byte, rng.Intn(80))
			rng.Read(msg)
		} else {
			msg = append([]byte(nil), base...)
			for j := 0; j < 1+rng.Intn(4); j++ {
				msg[rng.Intn(len(msg))] = byte(rng.Intn(256))
			}
			msg = msg[:rng.Intn(len(msg)+1)]
		}
		_, _ = parseQuery(msg)
		_, _, _ = readName(msg, rng.Intn(len(msg)+1))
		_, _ = answerAddresses(msg, 1, "a.allowed.test")
		mangled := append([]byte(nil), answer...)
		mangled[rng.Intn(len(mangled))] = byte(rng.Intn(256))
		mangled = mangled[:rng.Intn(len(mangled)+1)]
		r.ask = func(*dnsConfig, []byte) ([]byte, error) { return mangled, nil }
		_ = r.answer(msg, true)
		_ = r.answer(base, true)
	}
	// A compression pointer to itself ends.
	loop := append(append([]byte(nil), base[:12]...), 0xC0, 12)
	binary.BigEndian.PutUint16(loop[4:6], 0)
	binary.BigEndian.PutUint16(loop[6:8], 1)
	if _, _, err := readName(loop, 12); err == nil {
		t.Fatal("a pointer loop was read")
	}
}

func TestConfigIsChecked(t *testing.T) {
	for _, bad := range []string{
		`{"generation":"g","upstream":[],"ttl_min":1,"ttl_max":2,"entries":[{"name":"a.test","set4":"a","set6":"b"}]}`,
		`{"generation":"g","upstream":["1.2.3.4"],"ttl_min":1,"ttl_max":2,"entries":[{"name":"a.test","set4":"a\nflush","set6":"b"}]}`,
		`{"generation":"g","upstream":["x"],"ttl_min":1,"ttl_max":2}`,
		`{"generation":"g\n","upstream":[],"ttl_min":1,"ttl_max":2}`,
		`not json`,
	} {
		if _, err := parseConfig([]byte(bad)); err == nil {
			t.Errorf("accepted %s", bad)
		}
	}
	if _, err := parseConfig([]byte(`{"generation":"g","upstream":[],"ttl_min":1,"ttl_max":2}`)); err != nil {
		t.Fatal(err)
	}
}

func frame(msg []byte) []byte {
	out := make([]byte, 2, 2+len(msg))
	binary.BigEndian.PutUint16(out, uint16(len(msg)))
	return append(out, msg...)
}

func TestExchangeAllCopiesOneAnswerPerQuery(t *testing.T) {
	queries := append(frame(makeQuery(1, "a.test", dnsTypeA)), frame(makeQuery(2, "a.test", dnsTypeAAAA))...)
	client, server := net.Pipe()
	go func() {
		defer server.Close()
		got := make([]byte, len(queries))
		if _, err := io.ReadFull(server, got); err != nil || !bytes.Equal(got, queries) {
			return
		}
		// Two answers, then more bytes that must not be read (the server keeps the line open).
		_, _ = server.Write(append(append(frame([]byte("one")), frame([]byte("two"))...), 0, 9))
	}()
	var out bytes.Buffer
	if err := exchangeAll(client, queries, &out); err != nil {
		t.Fatal(err)
	}
	if want := append(frame([]byte("one")), frame([]byte("two"))...); !bytes.Equal(out.Bytes(), want) {
		t.Fatalf("got %x, want %x", out.Bytes(), want)
	}
}

func TestExchangeAllKeepsWhatCameBeforeTheServerClosed(t *testing.T) {
	queries := append(frame(makeQuery(1, "a.test", dnsTypeA)), frame(makeQuery(2, "a.test", dnsTypeAAAA))...)
	client, server := net.Pipe()
	go func() {
		_, _ = io.ReadFull(server, make([]byte, len(queries)))
		_, _ = server.Write(frame([]byte("one")))
		server.Close()
	}()
	var out bytes.Buffer
	if err := exchangeAll(client, queries, &out); err == nil {
		t.Fatal("a missing answer went unnoticed")
	}
	if !bytes.Equal(out.Bytes(), frame([]byte("one"))) {
		t.Fatalf("got %x", out.Bytes())
	}
	if err := exchangeAll(client, []byte{0, 9, 1}, &out); err == nil {
		t.Fatal("a truncated query was sent")
	}
}

// A query flood from the sandbox must not fork `ipset restore` without bound: those
// processes share the holder's pids_limit with corral's own commands (security round 3).
func TestSetWritersAreBoundedUnderAFlood(t *testing.T) {
	var mu sync.Mutex
	running, peak := 0, 0
	r := &resolver{cfg: testConfig(), addSets: func([]string) error {
		mu.Lock()
		running++
		if running > peak {
			peak = running
		}
		mu.Unlock()
		time.Sleep(5 * time.Millisecond)
		mu.Lock()
		running--
		mu.Unlock()
		return nil
	}, ask: func(_ *dnsConfig, q []byte) ([]byte, error) {
		return makeAnswer(q, [][4]any{{"a.allowed.test", dnsTypeA, 30, []byte{192, 0, 2, 10}}}), nil
	}}
	var wg sync.WaitGroup
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func(id uint16) {
			defer wg.Done()
			if r.answer(makeQuery(id, "a.allowed.test", dnsTypeA), true) == nil {
				t.Errorf("query %d got no answer", id)
			}
		}(uint16(i))
	}
	wg.Wait()
	if peak > 4 {
		t.Fatalf("%d ipset writers ran at once; at most 4 may", peak)
	}
}
