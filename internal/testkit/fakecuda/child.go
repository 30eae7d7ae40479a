package fakecuda

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// childEnv marks the child process in which OnFake runs a test over the
// fake driver.
const childEnv = "CUDAMEM_FAKE_CHILD"

// OnFake reports whether the calling test runs over the fake driver now.
// In the test process it builds the fake, runs the test again in a child
// process of this test binary over it (with env added to the child's
// environment, FAKECUDA_VERSION=12070 for one), fails unless the child's
// test passed, and returns false: the caller then returns. In the child it
// returns true. Without a C compiler the test is skipped, unless Required.
// A package whose tests all run over the fake has Main instead; OnFake is
// for CPU tests beside GPU tests, which run over the real driver in the
// test process.
func OnFake(t *testing.T, env ...string) bool {
	t.Helper()
	if os.Getenv(childEnv) == "1" {
		return true
	}
	path, err := Build(t.TempDir())
	if errors.Is(err, ErrNoCompiler) && !Required() {
		t.Skipf("the fake driver needs a C compiler: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v", "-test.timeout=5m")
	cmd.Env = append(append(os.Environ(), childEnv+"=1", "CUDAMEM_DRIVER="+path), env...)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: "+t.Name()+" ") {
		t.Fatalf("over the fake driver (%s): %v\n%s", strings.Join(env, " "), err, out)
	}
	t.Logf("over the fake driver (%s):\n%s", strings.Join(env, " "), out)
	return false
}
