package harness

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// cniCacheDir is where libcni (inside containerd) caches ADD results,
// whatever containerd's CNI configuration says; DEL removes the entries.
const cniCacheDir = "/var/lib/cni"

// Network is the CNI network of an Env's pods: a bridge of its own with
// host-local addresses from a private /24. The bridge gets no address and
// no masquerading, so the host's routes, forwarding sysctls and iptables stay
// untouched; pods reach each other only.
type Network struct {
	// Name is the CNI network name.
	Name string
	// Bridge is the bridge interface the bridge plugin creates.
	Bridge string
	// Subnet is the pods' address range.
	Subnet string
	// BinDir holds the bridge, host-local and loopback plugins.
	BinDir string
	// ConfDir holds the network's conflist, and nothing else.
	ConfDir string
	// IPAMDir is host-local's allocation store.
	IPAMDir string

	// cacheExisted records which of libcni's cache directories existed.
	cacheExisted map[string]bool
}

// newNetwork picks names and a subnet derived from dir (so concurrent Envs
// differ) and writes the conflist under dir.
func newNetwork(dir string, tools Tools) (*Network, error) {
	h := fnv.New32a()
	h.Write([]byte(dir))
	sum := h.Sum32()
	var id [4]byte
	binary.BigEndian.PutUint32(id[:], sum)
	tag := hex.EncodeToString(id[:]) // 8 characters: interface names stop at 15
	n := &Network{
		Name:    "gs-it-" + tag,
		Bridge:  "gsbr" + tag,
		BinDir:  filepath.Join(tools.Dir, "cni"),
		ConfDir: filepath.Join(dir, "net.d"),
		IPAMDir: filepath.Join(dir, "ipam"),
		cacheExisted: map[string]bool{
			cniCacheDir: exists(cniCacheDir), filepath.Join(cniCacheDir, "results"): exists(filepath.Join(cniCacheDir, "results")),
		},
	}
	for _, p := range []string{"bridge", "host-local", "loopback"} {
		if st, err := os.Stat(filepath.Join(n.BinDir, p)); err != nil || st.Mode().Perm()&0o111 == 0 {
			return nil, fmt.Errorf("CNI plugin %s missing from %s (run hack/install-tools.sh)", p, n.BinDir)
		}
	}
	if _, err := net.InterfaceByName(n.Bridge); err == nil {
		return nil, fmt.Errorf("interface %s already exists: another harness uses it, or a run crashed (ip link del %s)", n.Bridge, n.Bridge)
	}
	subnet, err := freeSubnet(byte(sum))
	if err != nil {
		return nil, err
	}
	n.Subnet = subnet
	if err := mkdirs(0o755, n.ConfDir, n.IPAMDir); err != nil {
		return nil, err
	}
	conf, err := json.MarshalIndent(n.conflist(), "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode CNI config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(n.ConfDir, "10-"+n.Name+".conflist"), conf, 0o644); err != nil {
		return nil, fmt.Errorf("write CNI config: %w", err)
	}
	return n, nil
}

func (n *Network) conflist() map[string]any {
	return map[string]any{
		"cniVersion": "1.0.0",
		"name":       n.Name,
		"plugins": []any{map[string]any{
			"type":        "bridge",
			"bridge":      n.Bridge,
			"isGateway":   false,
			"ipMasq":      false,
			"hairpinMode": false,
			"ipam": map[string]any{
				"type":    "host-local",
				"ranges":  [][]map[string]string{{{"subnet": n.Subnet}}},
				"dataDir": n.IPAMDir,
			},
		}},
	}
}

// freeSubnet returns 10.213.X.0/24, starting at X = start, that overlaps no
// IPv4 route of the host.
func freeSubnet(start byte) (string, error) {
	routes, err := ipv4Routes()
	if err != nil {
		return "", err
	}
	for i := range 256 {
		_, cand, _ := net.ParseCIDR(fmt.Sprintf("10.213.%d.0/24", byte(int(start)+i)))
		clash := false
		for _, r := range routes {
			if r.Contains(cand.IP) || cand.Contains(r.IP) {
				clash = true
				break
			}
		}
		if !clash {
			return cand.String(), nil
		}
	}
	return "", errors.New("no free /24 in 10.213.0.0/16 for the pods' network")
}

// ipv4Routes reads the host's IPv4 routes from /proc/net/route, except the
// default route (which contains everything).
func ipv4Routes() ([]*net.IPNet, error) {
	f, err := os.Open("/proc/net/route")
	if err != nil {
		return nil, fmt.Errorf("read routes: %w", err)
	}
	defer f.Close()
	var nets []*net.IPNet
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 8 || f[0] == "Iface" {
			continue
		}
		dst, err1 := hex.DecodeString(f[1])
		mask, err2 := hex.DecodeString(f[7])
		if err1 != nil || err2 != nil || len(dst) != 4 || len(mask) != 4 {
			continue
		}
		// The kernel prints them in host (little-endian) byte order.
		ip := net.IPv4(dst[3], dst[2], dst[1], dst[0])
		m := net.IPv4Mask(mask[3], mask[2], mask[1], mask[0])
		if ones, _ := m.Size(); ones == 0 {
			continue
		}
		nets = append(nets, &net.IPNet{IP: ip.Mask(m), Mask: m})
	}
	return nets, sc.Err()
}

// remove deletes the bridge and libcni's cached results of the network and
// of the given sandboxes (containerd's own loopback network caches under
// another name), and libcni's cache directories if they did not exist
// before. It runs after every pod is gone.
func (n *Network) remove(sandboxIDs []string) error {
	var errs []error
	if _, err := net.InterfaceByName(n.Bridge); err == nil {
		if out, err := exec.Command("ip", "link", "del", n.Bridge).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("delete bridge %s: %w: %s", n.Bridge, err, strings.TrimSpace(string(out))))
		}
	}
	results := filepath.Join(cniCacheDir, "results")
	patterns := []string{n.Name + "-*"}
	for _, id := range sandboxIDs {
		patterns = append(patterns, "*-"+id+"-*")
	}
	for _, p := range patterns {
		files, _ := filepath.Glob(filepath.Join(results, p))
		for _, f := range files {
			errs = append(errs, os.Remove(f))
		}
	}
	for _, d := range []string{results, cniCacheDir} {
		if !n.cacheExisted[d] {
			_ = os.Remove(d) // only if empty: another user may have arrived
		}
	}
	return errors.Join(errs...)
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
