package mountgroup

import (
	"strings"
	"testing"

	"github.com/containerd/errdefs"
)

func TestFromLabels(t *testing.T) {
	m, err := FromLabels(map[string]string{UIDLabel: "0:100000:65536", GIDLabel: "0:200000:65536"})
	if err != nil {
		t.Fatal(err)
	}
	if uid, gid := m.Root(); uid != 100000 || gid != 200000 {
		t.Errorf("Root() = %d:%d, want 100000:200000", uid, gid)
	}
	if got, ok := toHost(m.UIDs, 1000); !ok || got != 101000 {
		t.Errorf("HostUID(1000) = %d, %v", got, ok)
	}
	if _, ok := toHost(m.UIDs, 65536); ok {
		t.Error("HostUID(65536) should be unmapped")
	}
	if got := m.String(); got != "uid=0:100000:65536 gid=0:200000:65536" {
		t.Errorf("String() = %q", got)
	}
	if m, err := FromLabels(map[string]string{"other": "x"}); m != nil || err != nil {
		t.Errorf("no labels: got %v, %v", m, err)
	}
	multi, err := FromLabels(map[string]string{UIDLabel: "0:100000:1,1:200001:65535", GIDLabel: "0:100000:65536"})
	if err != nil {
		t.Fatalf("multi-range: %v", err)
	}
	if got, _ := toHost(multi.UIDs, 5); got != 200005 {
		t.Errorf("multi-range HostUID(5) = %d", got)
	}
}

func TestFromLabelsErrors(t *testing.T) {
	good := "0:100000:65536"
	for _, tc := range []struct {
		name, uid, gid string
		noUID, noGID   bool
		wantLabel      string
		wantText       string
	}{
		{name: "uid without gid", uid: good, noGID: true, wantLabel: UIDLabel, wantText: "both are needed"},
		{name: "gid without uid", gid: good, noUID: true, wantLabel: GIDLabel, wantText: "both are needed"},
		{name: "empty", uid: "", gid: good, wantLabel: UIDLabel, wantText: "empty"},
		{name: "two fields", uid: "0:100000", gid: good, wantLabel: UIDLabel, wantText: "container:host:size"},
		{name: "four fields", uid: "0:1:2:3", gid: good, wantLabel: UIDLabel, wantText: "container:host:size"},
		{name: "not a number", uid: "0:abc:65536", gid: good, wantLabel: UIDLabel, wantText: "decimal"},
		{name: "negative", uid: "0:-1:65536", gid: good, wantLabel: UIDLabel, wantText: "decimal"},
		{name: "plus sign", uid: "0:+5:65536", gid: good, wantLabel: UIDLabel, wantText: "decimal"},
		{name: "leading zero", uid: "0:0100000:65536", gid: good, wantLabel: UIDLabel, wantText: "decimal"},
		{name: "above 2^32", uid: "0:4294967296:1", gid: good, wantLabel: UIDLabel, wantText: "decimal"},
		{name: "zero size", uid: "0:100000:0", gid: good, wantLabel: UIDLabel, wantText: "size 0"},
		{name: "host overflow", uid: "0:4294967290:10", gid: good, wantLabel: UIDLabel, wantText: "runs past"},
		{name: "container overflow", uid: "4294967290:1:10", gid: good, wantLabel: UIDLabel, wantText: "runs past"},
		{name: "overlap inside", uid: "0:100000:10,5:200000:10", gid: good, wantLabel: UIDLabel, wantText: "overlap inside"},
		{name: "overlap host", uid: "0:100000:10,10:100005:10", gid: good, wantLabel: UIDLabel, wantText: "overlap on the host"},
		{name: "root unmapped", uid: "1:100000:65535", gid: good, wantLabel: UIDLabel, wantText: "container ID 0"},
		{name: "bad gid", uid: good, gid: "x", wantLabel: GIDLabel, wantText: "container:host:size"},
		{name: "trailing comma", uid: good + ",", gid: good, wantLabel: UIDLabel, wantText: "container:host:size"},
		{name: "too many ranges", uid: strings.Repeat("1:1:1,", 340) + "0:0:1", gid: good, wantLabel: UIDLabel, wantText: "at most 340"},
		{name: "huge", uid: strings.Repeat("9", 20000), gid: good, wantLabel: UIDLabel, wantText: "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			labels := map[string]string{}
			if !tc.noUID {
				labels[UIDLabel] = tc.uid
			}
			if !tc.noGID {
				labels[GIDLabel] = tc.gid
			}
			m, err := FromLabels(labels)
			if err == nil {
				t.Fatalf("got mapping %v, want error", m)
			}
			if !errdefs.IsInvalidArgument(err) {
				t.Errorf("error %v is not invalid argument", err)
			}
			if !strings.Contains(err.Error(), tc.wantLabel) || !strings.Contains(err.Error(), tc.wantText) {
				t.Errorf("error %q should name %q and say %q", err, tc.wantLabel, tc.wantText)
			}
		})
	}
}
