package main

import (
	"net"
	"testing"
	"time"
)

func TestDialSaysConnectedOrRefusedAtOnce(t *testing.T) {
	open, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	port := open.Addr().(*net.TCPAddr).Port
	if !dial(net.ParseIP("127.0.0.1"), 0, port) {
		t.Fatal("a listening port was not reached")
	}
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	gone := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	started := time.Now()
	if dial(net.ParseIP("127.0.0.1"), 0, gone) {
		t.Fatal("a closed port was reached")
	}
	if took := time.Since(started); took > 500*time.Millisecond {
		t.Fatalf("a refusal took %v", took)
	}
	if dial(net.ParseIP("::1"), 0, gone) {
		t.Fatal("a closed IPv6 port was reached")
	}
}

func TestZonedNamesTheLinkOfALinkLocalAddress(t *testing.T) {
	ip, zone, err := zoned("fe80::1%lo")
	lo, _ := net.InterfaceByName("lo")
	if err != nil || !ip.Equal(net.ParseIP("fe80::1")) || lo == nil || zone != uint32(lo.Index) {
		t.Fatalf("fe80::1%%lo: %v %d %v", ip, zone, err)
	}
	if _, zone, err := zoned("10.0.0.1"); err != nil || zone != 0 {
		t.Fatalf("10.0.0.1: zone %d, %v", zone, err)
	}
	for _, bad := range []string{"10.0.0.1%lo", "fe80::1%no-such-link", "nonsense"} {
		if _, _, err := zoned(bad); err == nil {
			t.Fatalf("%q was taken", bad)
		}
	}
}
