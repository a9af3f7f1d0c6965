// The denied-egress reader: `corral-exec --nflog SELF-PATH GROUP`, run by corral in the
// *holder* (which owns the sandbox's network namespace and alone has NET_ADMIN there).
//
// It binds nfnetlink_log group GROUP of that namespace, into which corral's rules send
// every refused packet (rate-limited, before its REJECT), and prints one line per packet:
//
//	E <unix-nanoseconds> <prefix> <ip-version> <protocol-number> <destination> <port|->
//
// then `L <n>` when the kernel dropped n messages because this reader fell behind. The
// first line, once the group is bound, is `H 1`. The process exits when its stdin ends
// (corral closed the stream) or stdout breaks.
//
// The sandbox cannot reach any of this: binding a log group, or sending to one, needs
// NET_ADMIN in the namespace, and the sandbox never has it; the holder's filesystem and
// processes are not the sandbox's. What it controls is what it sends, and a packet is
// reported as the kernel logged it: only its headers are read, bounded by the lengths the
// kernel gives, and the prefix (corral's own, from the rule) is printed only if it is a
// short run of [a-z0-9:_-].
package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"
)

const (
	nfnlSubsysULOG      = 4
	nfulnlMsgPacket     = 0
	nfulnlMsgConfig     = 1
	nfulaCfgCmd         = 1
	nfulaCfgMode        = 2
	nfulaCfgQThresh     = 5
	nfulaCfgTimeout     = 4
	nfulnlCfgCmdBind    = 1
	nfulnlCfgCmdPfBind  = 3
	nfulnlCopyPacket    = 2
	nfulaPayload        = 9
	nfulaPrefix         = 10
	netlinkNetfilter    = 12
	nlaTypeMask         = 0x3fff
	copyRange           = 128
	maxPrefix           = 64
	receiveBufferBytes  = 1 << 20
	nlmsgHeaderLen      = 16
	nfgenHeaderLen      = 4
	protoTCP, protoUDP  = 6, 17
	protoSCTP, protoDCP = 132, 33
	protoUDPLite        = 136
)

func nflogMain(self string, group string) {
	_ = os.Remove(self)
	g, err := strconv.ParseUint(group, 10, 16)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bad group:", group)
		os.Exit(2)
	}
	fd, err := syscall.Socket(syscall.AF_NETLINK, syscall.SOCK_RAW, netlinkNetfilter)
	if err != nil {
		fmt.Fprintln(os.Stderr, "netlink socket:", err)
		os.Exit(3)
	}
	_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_RCVBUF, receiveBufferBytes)
	if err := syscall.Bind(fd, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		fmt.Fprintln(os.Stderr, "netlink bind:", err)
		os.Exit(3)
	}
	// PF_BIND is a no-op on current kernels and needed on old ones; its answer is ignored.
	for _, family := range []uint8{syscall.AF_INET, syscall.AF_INET6} {
		_ = configure(fd, family, 0, attr(nfulaCfgCmd, []byte{nfulnlCfgCmdPfBind, 0, 0, 0}), false)
	}
	mode := make([]byte, 8)
	binary.BigEndian.PutUint32(mode[0:4], copyRange)
	mode[4] = nfulnlCopyPacket
	steps := [][]byte{
		attr(nfulaCfgCmd, []byte{nfulnlCfgCmdBind, 0, 0, 0}),
		append(attr(nfulaCfgMode, mode[:6]), attr(nfulaCfgQThresh, be32(1))...),
		attr(nfulaCfgTimeout, be32(1)),
	}
	for i, step := range steps {
		if err := configure(fd, syscall.AF_UNSPEC, uint16(g), step, true); err != nil {
			fmt.Fprintf(os.Stderr, "binding nflog group %d (step %d): %v\n", g, i, err)
			os.Exit(3)
		}
	}
	out := bufio.NewWriterSize(os.Stdout, 64<<10)
	emit := func(line string) {
		if _, err := out.WriteString(line); err != nil {
			os.Exit(0)
		}
	}
	emit("H 1\n")
	if out.Flush() != nil {
		os.Exit(0)
	}
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	buf := make([]byte, 1<<16)
	lost := 0
	for {
		n, _, err := syscall.Recvfrom(fd, buf, 0)
		if err == syscall.ENOBUFS {
			lost++
			emit(fmt.Sprintf("L %d\n", lost))
			_ = out.Flush()
			continue
		}
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "netlink receive:", err)
			os.Exit(4)
		}
		now := time.Now().UnixNano()
		for _, line := range packets(buf[:n], now) {
			emit(line)
		}
		if out.Flush() != nil {
			os.Exit(0)
		}
	}
}

func be32(v uint32) []byte {
	b := make([]byte, 4)
	binary.BigEndian.PutUint32(b, v)
	return b
}

func attr(kind uint16, value []byte) []byte {
	size := 4 + len(value)
	b := make([]byte, (size+3)&^3)
	binary.LittleEndian.PutUint16(b[0:2], uint16(size))
	binary.LittleEndian.PutUint16(b[2:4], kind)
	copy(b[4:], value)
	return b
}

var sequence uint32

// configure sends one NFULNL_MSG_CONFIG and, if ack, waits for the kernel's answer.
func configure(fd int, family uint8, group uint16, attrs []byte, ack bool) error {
	sequence++
	msg := make([]byte, nlmsgHeaderLen+nfgenHeaderLen+len(attrs))
	binary.LittleEndian.PutUint32(msg[0:4], uint32(len(msg)))
	binary.LittleEndian.PutUint16(msg[4:6], nfnlSubsysULOG<<8|nfulnlMsgConfig)
	flags := uint16(syscall.NLM_F_REQUEST)
	if ack {
		flags |= syscall.NLM_F_ACK
	}
	binary.LittleEndian.PutUint16(msg[6:8], flags)
	binary.LittleEndian.PutUint32(msg[8:12], sequence)
	msg[16] = family
	msg[17] = 0 // NFNETLINK_V0
	binary.BigEndian.PutUint16(msg[18:20], group)
	copy(msg[20:], attrs)
	if err := syscall.Sendto(fd, msg, 0, &syscall.SockaddrNetlink{Family: syscall.AF_NETLINK}); err != nil {
		return err
	}
	if !ack {
		return nil
	}
	buf := make([]byte, 8192)
	for {
		n, _, err := syscall.Recvfrom(fd, buf, 0)
		if err != nil {
			return err
		}
		for off := 0; off+nlmsgHeaderLen <= n; {
			size := int(binary.LittleEndian.Uint32(buf[off : off+4]))
			kind := binary.LittleEndian.Uint16(buf[off+4 : off+6])
			seq := binary.LittleEndian.Uint32(buf[off+8 : off+12])
			if size < nlmsgHeaderLen || off+size > n {
				return fmt.Errorf("malformed netlink answer")
			}
			if kind == syscall.NLMSG_ERROR && seq == sequence && size >= nlmsgHeaderLen+4 {
				code := int32(binary.LittleEndian.Uint32(buf[off+16 : off+20]))
				if code != 0 {
					return syscall.Errno(-code)
				}
				return nil
			}
			off += (size + 3) &^ 3
		}
	}
}

// packets turns one receive's worth of netlink messages into event lines.
func packets(buf []byte, now int64) []string {
	var lines []string
	for off := 0; off+nlmsgHeaderLen <= len(buf); {
		size := int(binary.LittleEndian.Uint32(buf[off : off+4]))
		kind := binary.LittleEndian.Uint16(buf[off+4 : off+6])
		if size < nlmsgHeaderLen || off+size > len(buf) {
			break
		}
		if kind == nfnlSubsysULOG<<8|nfulnlMsgPacket && size >= nlmsgHeaderLen+nfgenHeaderLen {
			if line, ok := packet(buf[off+nlmsgHeaderLen:off+size], now); ok {
				lines = append(lines, line)
			}
		}
		off += (size + 3) &^ 3
	}
	return lines
}

func packet(msg []byte, now int64) (string, bool) {
	prefix, payload := "", []byte(nil)
	for off := nfgenHeaderLen; off+4 <= len(msg); {
		size := int(binary.LittleEndian.Uint16(msg[off : off+2]))
		kind := binary.LittleEndian.Uint16(msg[off+2:off+4]) & nlaTypeMask
		if size < 4 || off+size > len(msg) {
			break
		}
		value := msg[off+4 : off+size]
		switch kind {
		case nfulaPrefix:
			prefix = cleanPrefix(value)
		case nfulaPayload:
			payload = value
		}
		off += (size + 3) &^ 3
	}
	if prefix == "" || len(payload) == 0 {
		return "", false
	}
	version, proto, dst, port, ok := headers(payload)
	if !ok {
		return "", false
	}
	portText := "-"
	if port >= 0 {
		portText = strconv.Itoa(port)
	}
	return fmt.Sprintf("E %d %s %d %d %s %s\n", now, prefix, version, proto, dst, portText), true
}

func cleanPrefix(value []byte) string {
	for i, c := range value {
		if c == 0 {
			value = value[:i]
			break
		}
	}
	if len(value) == 0 || len(value) > maxPrefix {
		return ""
	}
	for _, c := range value {
		ok := (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == ':' || c == '_' || c == '-'
		if !ok {
			return ""
		}
	}
	return string(value)
}

// headers reads the IP version, transport protocol, destination and destination port
// (-1 where the protocol has none, or the packet is a later fragment or cut short).
func headers(p []byte) (int, int, string, int, bool) {
	if len(p) < 1 {
		return 0, 0, "", 0, false
	}
	switch p[0] >> 4 {
	case 4:
		if len(p) < 20 {
			return 0, 0, "", 0, false
		}
		ihl := int(p[0]&0x0f) * 4
		proto := int(p[9])
		dst := net.IP(p[16:20]).String()
		fragment := binary.BigEndian.Uint16(p[6:8]) & 0x1fff
		if ihl < 20 || fragment != 0 {
			return 4, proto, dst, -1, true
		}
		return 4, proto, dst, port(proto, p, ihl), true
	case 6:
		if len(p) < 40 {
			return 0, 0, "", 0, false
		}
		dst := net.IP(p[24:40]).String()
		next, off := int(p[6]), 40
		// Hop-by-hop, routing, destination options: skip to the transport header.
		for hops := 0; hops < 8 && (next == 0 || next == 43 || next == 60); hops++ {
			if off+2 > len(p) {
				return 6, next, dst, -1, true
			}
			next, off = int(p[off]), off+(int(p[off+1])+1)*8
		}
		if next == 44 { // fragment header: only the first fragment carries the port
			if off+8 > len(p) {
				return 6, next, dst, -1, true
			}
			first := binary.BigEndian.Uint16(p[off+2:off+4])&0xfff8 == 0
			next, off = int(p[off]), off+8
			if !first {
				return 6, next, dst, -1, true
			}
		}
		return 6, next, dst, port(next, p, off), true
	}
	return 0, 0, "", 0, false
}

func port(proto int, p []byte, off int) int {
	switch proto {
	case protoTCP, protoUDP, protoSCTP, protoDCP, protoUDPLite:
		if off+4 <= len(p) {
			return int(binary.BigEndian.Uint16(p[off+2 : off+4]))
		}
	}
	return -1
}
