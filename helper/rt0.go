package main

// rt0 is corral-exec's entry point, which build.sh links in (-E main.rt0): it makes the
// process non-dumpable with its first instructions, before the Go runtime starts, which
// takes milliseconds on a busy machine (rt0_linux_*.s). A build without it still becomes
// non-dumpable, a little later: package nodump.
func rt0()
