package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// The size of the path in FILES_CHILD, printed by a child run of this test binary, since
// a refusal exits the process.
func TestFileSizeRefusesWhatIsNoRegularFile(t *testing.T) {
	if path := os.Getenv("FILES_CHILD"); path != "" {
		fileSizeMain(path)
		return
	}
	dir := t.TempDir()
	regular := filepath.Join(dir, "regular")
	if err := os.WriteFile(regular, []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("/dev/zero", filepath.Join(dir, "zero")); err != nil {
		t.Fatal(err)
	}
	cases := map[string]int{
		regular:                    0,
		filepath.Join(dir, "fifo"): fileNotRegular,
		filepath.Join(dir, "zero"): fileIsLink,
		"/dev/zero":                fileNotRegular,
		dir:                        fileIsDir,
		filepath.Join(dir, "gone"): fileMissing,
	}
	for path, want := range cases {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestFileSizeRefusesWhatIsNoRegularFile$")
		cmd.Env = append(os.Environ(), "FILES_CHILD="+path)
		out, err := cmd.Output()
		cancel()
		code := 0
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			code = exit.ExitCode()
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if code != want {
			t.Errorf("%s: exit %d, want %d (%q)", path, code, want, out)
		}
	}
}
