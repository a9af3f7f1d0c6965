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
	if !dial(net.ParseIP("127.0.0.1"), port) {
		t.Fatal("a listening port was not reached")
	}
	closed, _ := net.Listen("tcp", "127.0.0.1:0")
	gone := closed.Addr().(*net.TCPAddr).Port
	closed.Close()
	started := time.Now()
	if dial(net.ParseIP("127.0.0.1"), gone) {
		t.Fatal("a closed port was reached")
	}
	if took := time.Since(started); took > 500*time.Millisecond {
		t.Fatalf("a refusal took %v", took)
	}
	if dial(net.ParseIP("::1"), gone) {
		t.Fatal("a closed IPv6 port was reached")
	}
}
