package fakecuda

import (
	"errors"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// twoDevChildEnv marks the child process in which RunOnTwoDevices runs
// GPU tests over the fake driver.
const twoDevChildEnv = "CUDAMEM_FAKE_TWODEV_CHILD"

// RunOnTwoDevices runs the named GPU tests (top-level test functions of
// the calling test binary) in a child process over the fake driver with
// two devices, and fails unless each passed with none of its subtests
// skipped: on the fake nothing a second GPU would provide is missing. In
// the child it skips (the GPU tests run there by name, not the caller).
// Without a C compiler it skips, unless Required says the fake must build.
func RunOnTwoDevices(t *testing.T, tests ...string) {
	t.Helper()
	if os.Getenv(twoDevChildEnv) == "1" {
		t.Skip("in the child over the fake driver")
	}
	path, err := Build(t.TempDir())
	if errors.Is(err, ErrNoCompiler) && !Required() {
		t.Skipf("the fake driver needs a C compiler: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^("+strings.Join(tests, "|")+")$", "-test.count=1", "-test.v", "-test.timeout=5m")
	// CUDAMEM_REQUIRE_GPU: a driver that fails to load fails the tests.
	cmd.Env = append(os.Environ(), twoDevChildEnv+"=1", "CUDAMEM_DRIVER="+path, "FAKECUDA_DEVICES=2", "CUDAMEM_REQUIRE_GPU=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("over the fake driver's two devices: %v\n%s", err, out)
	}
	for _, name := range tests {
		if !strings.Contains(string(out), "--- PASS: "+name+" ") {
			t.Errorf("%s did not pass over the fake driver's two devices", name)
		}
	}
	if skips := regexp.MustCompile(`--- SKIP: .*`).FindAllString(string(out), -1); len(skips) > 0 {
		t.Errorf("skipped over the fake driver's two devices: %s", strings.Join(skips, "; "))
	}
	t.Logf("the child over the fake driver's two devices said:\n%s", out)
}
