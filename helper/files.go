package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"syscall"
)

// The exit codes of --file-size and --file-range, as corral's k8s session reads them.
const (
	fileMissing    = 44
	fileIsDir      = 45
	fileIsLink     = 46
	fileNotRegular = 47
)

// openRegular opens path the way corral's file reads need it, whatever the workload
// planted there: a symlink at its last component is refused (O_NOFOLLOW), a FIFO cannot
// block the open (O_NONBLOCK), a terminal is never made the controlling one, and anything
// but a regular file (a FIFO, a device, a socket) is refused by the descriptor's own type.
// On a refusal it exits with one of the codes above, what it found on stderr.
func openRegular(path string) *os.File {
	flags := syscall.O_RDONLY | syscall.O_NOFOLLOW | syscall.O_NONBLOCK | syscall.O_NOCTTY |
		syscall.O_CLOEXEC
	fd, err := syscall.Open(path, flags, 0)
	switch {
	case errors.Is(err, syscall.ENOENT):
		os.Exit(fileMissing)
	case errors.Is(err, syscall.ELOOP):
		os.Exit(fileIsLink)
	case err != nil:
		fail(err)
	}
	var st syscall.Stat_t
	if err := syscall.Fstat(fd, &st); err != nil {
		fail(err)
	}
	switch st.Mode & syscall.S_IFMT {
	case syscall.S_IFREG:
		return os.NewFile(uintptr(fd), path)
	case syscall.S_IFDIR:
		os.Exit(fileIsDir)
	}
	fmt.Fprintln(os.Stderr, fileKind(st.Mode&syscall.S_IFMT))
	os.Exit(fileNotRegular)
	return nil
}

func fileKind(format uint32) string {
	switch format {
	case syscall.S_IFIFO:
		return "a FIFO"
	case syscall.S_IFCHR:
		return "a character device"
	case syscall.S_IFBLK:
		return "a block device"
	case syscall.S_IFSOCK:
		return "a socket"
	}
	return fmt.Sprintf("of type %#o", format)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

// fileSizeMain prints the size of the regular file path, as its descriptor has it.
func fileSizeMain(path string) {
	file := openRegular(path)
	info, err := file.Stat()
	if err != nil {
		fail(err)
	}
	fmt.Println(info.Size())
}

// fileRangeMain copies count MiB of path from skip MiB on to stdout, never more.
func fileRangeMain(path, skip, count string) {
	first, err1 := strconv.ParseInt(skip, 10, 64)
	length, err2 := strconv.ParseInt(count, 10, 64)
	if err1 != nil || err2 != nil || first < 0 || length < 0 || first > 1<<42 || length > 1<<12 {
		fail(fmt.Errorf("bad range %q %q", skip, count))
	}
	file := openRegular(path)
	if _, err := io.Copy(os.Stdout, io.NewSectionReader(file, first<<20, length<<20)); err != nil {
		fail(err)
	}
}
