package main

import (
	"encoding/binary"
	"strings"
	"testing"
)

func ipv4(proto byte, dst [4]byte, transport []byte) []byte {
	p := make([]byte, 20+len(transport))
	p[0] = 0x45
	p[9] = proto
	copy(p[16:20], dst[:])
	copy(p[20:], transport)
	return p
}

func ipv6(next byte, dst [16]byte, rest []byte) []byte {
	p := make([]byte, 40+len(rest))
	p[0] = 0x60
	p[6] = next
	copy(p[24:40], dst[:])
	copy(p[40:], rest)
	return p
}

func ports(dport uint16) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint16(b[0:2], 40000)
	binary.BigEndian.PutUint16(b[2:4], dport)
	return b
}

func message(prefix string, payload []byte) []byte {
	body := []byte{2, 0, 0, 13} // nfgenmsg: AF_INET, v0, group 13
	if prefix != "" {
		body = append(body, attr(nfulaPrefix, append([]byte(prefix), 0))...)
	}
	if payload != nil {
		body = append(body, attr(nfulaPayload, payload)...)
	}
	msg := make([]byte, nlmsgHeaderLen, nlmsgHeaderLen+len(body))
	msg = append(msg, body...)
	binary.LittleEndian.PutUint32(msg[0:4], uint32(len(msg)))
	binary.LittleEndian.PutUint16(msg[4:6], nfnlSubsysULOG<<8|nfulnlMsgPacket)
	return msg
}

func TestHeaders(t *testing.T) {
	v6dst := [16]byte{0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}
	hop := append([]byte{17, 0, 0, 0, 0, 0, 0, 0}, ports(53)...) // hop-by-hop, then UDP
	frag := append([]byte{6, 0, 0, 0, 0, 0, 0, 1}, ports(80)...) // first fragment, TCP
	later := append([]byte{6, 0, 0x05, 0x00, 0, 0, 0, 1}, ports(80)...)
	cases := []struct {
		name   string
		packet []byte
		want   string
	}{
		{"tcp4", ipv4(6, [4]byte{10, 0, 0, 2}, ports(8080)), "4 6 10.0.0.2 8080"},
		{"udp4", ipv4(17, [4]byte{10, 0, 0, 2}, ports(53)), "4 17 10.0.0.2 53"},
		{"icmp4", ipv4(1, [4]byte{10, 0, 0, 2}, []byte{8, 0}), "4 1 10.0.0.2 -"},
		{"cut-short tcp4", ipv4(6, [4]byte{10, 0, 0, 2}, []byte{1, 2}), "4 6 10.0.0.2 -"},
		{"tcp6", ipv6(6, v6dst, ports(443)), "6 6 fd00::2 443"},
		{"hop-by-hop udp6", ipv6(0, v6dst, hop), "6 17 fd00::2 53"},
		{"first fragment", ipv6(44, v6dst, frag), "6 6 fd00::2 80"},
		{"later fragment", ipv6(44, v6dst, later), "6 6 fd00::2 -"},
		{"ext header past the end", ipv6(0, v6dst, []byte{17, 200}), "6 17 fd00::2 -"},
	}
	for _, c := range cases {
		line, ok := packet(message("corral:run", c.packet)[nlmsgHeaderLen:], 7)
		want := "E 7 corral:run " + c.want + "\n"
		if !ok || line != want {
			t.Errorf("%s: got %q, %v; want %q", c.name, line, ok, want)
		}
	}
}

func TestRefused(t *testing.T) {
	good := ipv4(6, [4]byte{10, 0, 0, 2}, ports(80))
	bad := map[string][]byte{
		"no prefix":      message("", good),
		"foreign prefix": message("corral:run\n4", good),
		"spaces":         message("corral run", good),
		"long prefix":    message("corral:"+strings.Repeat("a", 80), good),
		"no payload":     message("corral:run", nil),
		"short ipv4":     message("corral:run", good[:19]),
		"short ipv6":     message("corral:run", ipv6(6, [16]byte{}, nil)[:39]),
		"not ip":         message("corral:run", []byte{0x50, 1, 2, 3}),
		"empty":          message("corral:run", []byte{}),
	}
	for name, msg := range bad {
		if line, ok := packet(msg[nlmsgHeaderLen:], 7); ok {
			t.Errorf("%s: printed %q", name, line)
		}
	}
}

func TestTruncatedMessages(t *testing.T) {
	msg := message("corral:run", ipv4(6, [4]byte{10, 0, 0, 2}, ports(80)))
	for cut := 0; cut < len(msg); cut++ {
		for _, line := range packets(msg[:cut], 7) {
			t.Errorf("cut at %d printed %q", cut, line)
		}
	}
	// An attribute claiming more than the message holds ends the walk, never panics.
	broken := append([]byte{}, msg...)
	binary.LittleEndian.PutUint16(broken[nlmsgHeaderLen+4:], 0xffff)
	_ = packets(broken, 7)
	if got := packets(append(msg, msg...), 7); len(got) != 2 {
		t.Errorf("two messages gave %q", got)
	}
}
