package migrate

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

// TestAtLowPriority checks that the borrower's work runs at nice borrowNice and
// that the caller's thread keeps its priority.
func TestAtLowPriority(t *testing.T) {
	before := threadNice(t)
	var inside int
	if err := atLowPriority(func() error { inside = threadNice(t); return nil }); err != nil {
		t.Fatal(err)
	}
	if inside != borrowNice {
		t.Errorf("nice inside atLowPriority = %d, want %d", inside, borrowNice)
	}
	if after := threadNice(t); after != before {
		t.Errorf("the caller's nice went from %d to %d", before, after)
	}
}

// threadNice reads the nice value of the calling thread (field 19 of
// /proc/thread-self/stat).
func threadNice(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/thread-self/stat")
	if err != nil {
		t.Fatal(err)
	}
	// The command name, in parentheses, may hold spaces.
	fields := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	n, err := strconv.Atoi(fields[16])
	if err != nil {
		t.Fatal(err)
	}
	return n
}
