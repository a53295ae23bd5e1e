package harness

import (
	"slices"
	"testing"
)

func TestPrivateStateArgs(t *testing.T) {
	e := &Env{Dir: "/e"}
	for _, tc := range []struct{ in, want []string }{
		{[]string{"run", "--rm", "img", "id"}, []string{"run", "--runc-root", "/e/runc", "--fifo-dir", "/e/fifo", "--rm", "img", "id"}},
		{[]string{"run", "--runc-root=/x", "img", "id"}, []string{"run", "--fifo-dir", "/e/fifo", "--runc-root=/x", "img", "id"}},
		{[]string{"c", "create", "img", "id"}, []string{"c", "create", "--runc-root", "/e/runc", "img", "id"}},
		{[]string{"tasks", "exec", "--exec-id", "x", "id", "sh"}, []string{"tasks", "exec", "--fifo-dir", "/e/fifo", "--exec-id", "x", "id", "sh"}},
		{[]string{"tasks", "rm", "-f", "id"}, []string{"tasks", "rm", "-f", "id"}},
		{[]string{"version"}, []string{"version"}},
	} {
		if got := e.privateStateArgs(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("privateStateArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestForegroundRun(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"run", "--rm", "--snapshotter", "grouped", "img", "id", "echo", "-d"}, true},
		{[]string{"run", "-d", "--null-io", "img", "id"}, false},
		{[]string{"run", "--null-io", "img", "id"}, false},
		{[]string{"run", "--tty", "img", "id"}, false},
		{[]string{"run", "--log-uri=file:///x", "img", "id"}, false},
		{[]string{"run", "--rm", "--snapshotter", "grouped", "-d", "img", "id"}, false},
		{[]string{"run", "--uidmap", "0:1:2", "--remap-labels", "--null-io", "img", "id"}, false},
		{[]string{"tasks", "start", "id"}, false},
	} {
		if got := foregroundRun(tc.args); got != tc.want {
			t.Errorf("foregroundRun(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}
