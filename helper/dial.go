package main

// `corral-exec --probe-dial CONTROL-PORT HOST PORT`: whether a TCP connection to
// HOST:PORT opens from this network namespace, for the policy probe. HOST may carry an
// IPv6 zone (`fe80::1%eth0`): a link-local address is reachable only through a link.
//
// busybox's nc connects blocking; where a CNI rejects with an ICMP error (kube-router),
// the kernel drops that error while connect holds the socket and reports the refusal
// only at the first SYN retransmit, a second later. Here the connect is non-blocking
// with IP_RECVERR (IPV6_RECVERR), so the ICMP error ends it as soon as it arrives.
//
// It prints one word: `connected` or `refused` (no connection within 2 s counts as
// refused), but only if the same dialler then reaches a listener of its own on loopback
// at CONTROL-PORT; otherwise `control-failed`: a dialler that cannot connect at all
// proves nothing.

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

const dialTimeout = 2 * time.Second

func probeDialMain(args []string) {
	control, err1 := strconv.Atoi(args[0])
	port, err2 := strconv.Atoi(args[2])
	ip, zone, err3 := zoned(args[1])
	if err1 != nil || err2 != nil || err3 != nil || control <= 0 || control > 65535 ||
		port <= 0 || port > 65535 {
		fmt.Fprintln(os.Stderr, "usage: corral-exec --probe-dial CONTROL-PORT IP[%ZONE] PORT")
		os.Exit(2)
	}
	listener, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(control)))
	if err != nil {
		fmt.Println("control-failed")
		return
	}
	defer listener.Close()
	go func() {
		for {
			conn, err := listener.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	seen := "refused"
	if dial(ip, zone, port) {
		seen = "connected"
	}
	if !dial(net.ParseIP("127.0.0.1"), 0, control) {
		seen = "control-failed"
	}
	fmt.Println(seen)
}

// zoned parses an address and its zone's interface index (0 without a zone).
func zoned(host string) (net.IP, uint32, error) {
	addr, name, found := strings.Cut(host, "%")
	ip := net.ParseIP(addr)
	if ip == nil || (found && ip.To4() != nil) {
		return nil, 0, fmt.Errorf("not an address: %q", host)
	}
	if !found {
		return ip, 0, nil
	}
	link, err := net.InterfaceByName(name)
	if err != nil {
		return nil, 0, err
	}
	return ip, uint32(link.Index), nil
}

// dial makes one non-blocking connect and says whether it completed.
func dial(ip net.IP, zone uint32, port int) bool {
	family, level, option := syscall.AF_INET, syscall.IPPROTO_IP, syscall.IP_RECVERR
	var sa syscall.Sockaddr
	if v4 := ip.To4(); v4 != nil {
		addr := &syscall.SockaddrInet4{Port: port}
		copy(addr.Addr[:], v4)
		sa = addr
	} else {
		family, level, option = syscall.AF_INET6, syscall.IPPROTO_IPV6, syscall.IPV6_RECVERR
		addr := &syscall.SockaddrInet6{Port: port, ZoneId: zone}
		copy(addr.Addr[:], ip.To16())
		sa = addr
	}
	fd, err := syscall.Socket(family, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return false
	}
	defer syscall.Close(fd)
	_ = syscall.SetsockoptInt(fd, level, option, 1)
	if err := syscall.Connect(fd, sa); err == nil {
		return true
	} else if err != syscall.EINPROGRESS {
		return false
	}
	deadline := time.Now().Add(dialTimeout)
	for time.Now().Before(deadline) {
		// Writable means the connect ended, one way or the other: SO_ERROR says which.
		fds := &syscall.FdSet{}
		fds.Bits[fd/64] |= 1 << (uint(fd) % 64)
		wait := syscall.NsecToTimeval(int64(10 * time.Millisecond))
		n, err := syscall.Select(fd+1, nil, fds, nil, &wait)
		if err != nil && err != syscall.EINTR {
			return false
		}
		if n > 0 {
			code, err := syscall.GetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_ERROR)
			return err == nil && code == 0
		}
	}
	return false
}
