package cli_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// binaryDir is the directory binary builds into, removed by TestMain.
var binaryDir string

// binary builds cmd/timebox once per test binary.
var binary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "timebox-cli-test")
	if err != nil {
		return "", err
	}
	binaryDir = dir
	bin := filepath.Join(dir, "timebox")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/timebox").CombinedOutput(); err != nil {
		return "", fmt.Errorf("build: %v\n%s", err, out)
	}
	return bin, nil
})

func timeboxBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin, err := binary()
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// startServe starts `timebox serve` on a free port and returns it and its
// URL; its stderr goes to errb.
func startServe(t *testing.T, bin, file, db string, env []string, errb io.Writer) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(bin, "serve", "-f", file, "--addr", "127.0.0.1:0", "--db", db)
	cmd.Env = env
	cmd.Stderr = errb
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		if m := servingRE.FindStringSubmatch(sc.Text()); m != nil {
			go io.Copy(io.Discard, out)
			return cmd, m[1]
		}
	}
	t.Fatalf("serve printed no address: %v", sc.Err())
	return nil, ""
}
