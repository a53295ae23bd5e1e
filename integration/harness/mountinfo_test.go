package harness

import (
	"slices"
	"testing"
)

func TestParseMountinfoLine(t *testing.T) {
	line := `412 30 0:77 / /tmp/gs\040it/rootfs rw,relatime shared:1 - overlay overlay rw,lowerdir=/l/3:/l/2:/l/1,upperdir=/l/4,workdir=/w/4,uuid=on`
	m, err := parseMountinfoLine(line)
	if err != nil {
		t.Fatal(err)
	}
	if m.ID != 412 || m.Parent != 30 || m.MountPoint != "/tmp/gs it/rootfs" || m.FSType != "overlay" || m.MountOptions != "rw,relatime" {
		t.Fatalf("parsed %+v", m)
	}
	if got := m.Lowerdirs(); !slices.Equal(got, []string{"/l/3", "/l/2", "/l/1"}) {
		t.Errorf("Lowerdirs() = %q", got)
	}
	if up, ok := m.Option("upperdir"); !ok || up != "/l/4" {
		t.Errorf("Option(upperdir) = %q, %v", up, ok)
	}
	if _, ok := m.Option("missing"); ok {
		t.Error("Option(missing) found")
	}
}

func TestLowerdirsForms(t *testing.T) {
	for _, tc := range []struct {
		opts string
		want []string
	}{
		{"rw,lowerdir=3/fs:2/fs:1/fs,upperdir=/u", []string{"3/fs", "2/fs", "1/fs"}},
		{"rw,lowerdir+=/a,lowerdir+=/b,datadir+=/d", []string{"/a", "/b", "/d"}},
		{`rw,lowerdir=/a\:b:/c::/data`, []string{`/a\:b`, "/c", "/data"}},
		{"rw,upperdir=/u", nil},
	} {
		if got := (Mount{SuperOptions: tc.opts}).Lowerdirs(); !slices.Equal(got, tc.want) {
			t.Errorf("Lowerdirs(%q) = %q, want %q", tc.opts, got, tc.want)
		}
	}
}

func TestParseMountinfoLineMalformed(t *testing.T) {
	for _, line := range []string{"", "1 2 3", "x 2 0:1 / /a rw - ext4 /dev/a rw", "1 2 0:1 / /a rw shared:1 ext4 /dev/a rw"} {
		if _, err := parseMountinfoLine(line); err == nil {
			t.Errorf("parseMountinfoLine(%q) succeeded", line)
		}
	}
}
