package kube

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"slices"
	"strings"

	"github.com/grouped-snapshotter/grouped-snapshotter/integration/harness"
)

// The netfilter dumps a snapshot records, by the command that makes them.
const (
	dumpIPv4 = "iptables-save"
	dumpIPv6 = "ip6tables-save"
	dumpNft  = "nft list ruleset"
	// dumpNfacct is the list of nfacct objects (nfacct.go).
	dumpNfacct = "nfacct"
)

// family is one iptables address family.
type family struct {
	save, restore, nft string
}

var families = []family{
	{save: "iptables-save", restore: "iptables-restore", nft: "ip"},
	{save: "ip6tables-save", restore: "ip6tables-restore", nft: "ip6"},
}

// dumpNetfilter returns the iptables (both families) and nftables rules,
// for the tools the host has.
func dumpNetfilter() (map[string]string, error) {
	out := map[string]string{}
	for _, cmd := range []string{dumpIPv4, dumpIPv6, dumpNft} {
		args := strings.Fields(cmd)
		if _, err := exec.LookPath(args[0]); err != nil {
			continue
		}
		text, err := run(nil, args[0], args[1:]...)
		if err != nil {
			return nil, err
		}
		out[cmd] = text
	}
	return out, nil
}

var (
	saveCounters = regexp.MustCompile(`\[\d+:\d+\]`)
	nftCounters  = regexp.MustCompile(`counter packets \d+ bytes \d+`)
)

// normalizeNetfilter drops what changes without anybody changing the rules:
// comments (timestamps), packet counters, and iptables tables with nothing
// but empty built-in chains accepting everything (with the legacy backend a
// table, once used, stays listed).
func normalizeNetfilter(text string) string {
	text = nftCounters.ReplaceAllString(saveCounters.ReplaceAllString(text, "[0:0]"), "counter")
	var out, table []string
	empty := true
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "":
		case strings.HasPrefix(line, "*"):
			table, empty = []string{line}, true
		case table != nil && line == "COMMIT":
			if !empty {
				out = append(out, table...)
				out = append(out, line)
			}
			table = nil
		case table != nil:
			table = append(table, line)
			if !strings.HasPrefix(line, ":") || !strings.Contains(line, " ACCEPT ") {
				empty = false
			}
		default:
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// savedTable is one table of an iptables-save dump.
type savedTable struct {
	chains map[string]bool
	rules  []string // "-A CHAIN ..." lines, in order
	has    map[string]bool
}

func parseSave(text string) map[string]*savedTable {
	tables := map[string]*savedTable{}
	var cur *savedTable
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "*"):
			cur = &savedTable{chains: map[string]bool{}, has: map[string]bool{}}
			tables[line[1:]] = cur
		case cur == nil:
		case strings.HasPrefix(line, ":"):
			cur.chains[strings.Fields(line[1:])[0]] = true
		case strings.HasPrefix(line, "-A "):
			cur.rules = append(cur.rules, line)
			cur.has[line] = true
		}
	}
	return tables
}

// restoreNetfilter removes the iptables rules and chains the cluster added:
// every KUBE-* chain that did not exist before, every new rule mentioning
// KUBE- in the other chains, and, with the nftables backend, the tables
// that did not exist before and are empty now. The host's other rules stay
// as they are. Then it deletes the nfacct objects that appeared.
func restoreNetfilter(before map[string]string, logf func(string, ...any)) error {
	var errs []error
	for _, f := range families {
		prev, ok := before[f.save]
		if !ok {
			continue
		}
		if err := restoreFamily(f, parseSave(prev), logf); err != nil {
			errs = append(errs, err)
		}
	}
	if prev, ok := before[dumpNfacct]; ok && len(errs) == 0 {
		errs = append(errs, restoreNfacct(prev, logf))
	}
	return errors.Join(errs...)
}

func restoreFamily(f family, before map[string]*savedTable, logf func(string, ...any)) error {
	text, err := run(nil, f.save)
	if err != nil {
		return err
	}
	now := parseSave(text)
	var script strings.Builder
	for name, t := range now {
		old := before[name]
		if old == nil {
			old = &savedTable{chains: map[string]bool{}, has: map[string]bool{}}
		}
		var newChains []string
		for ch := range t.chains {
			if strings.HasPrefix(ch, "KUBE-") && !old.chains[ch] {
				newChains = append(newChains, ch)
			}
		}
		var lines []string
		for _, r := range t.rules {
			chain := strings.Fields(r)[1]
			if old.has[r] || !strings.Contains(r, "KUBE-") || slices.Contains(newChains, chain) {
				continue
			}
			lines = append(lines, "-D"+r[2:])
		}
		// Flush every new chain before deleting any: they jump to each other.
		for _, ch := range newChains {
			lines = append(lines, "-F "+ch)
		}
		for _, ch := range newChains {
			lines = append(lines, "-X "+ch)
		}
		if len(lines) > 0 {
			logf("%s: removing %d KUBE-* chains and %d jump rules from table %s",
				f.save, len(newChains), len(lines)-2*len(newChains), name)
			fmt.Fprintf(&script, "*%s\n%s\nCOMMIT\n", name, strings.Join(lines, "\n"))
		}
	}
	if script.Len() > 0 {
		if _, err := run([]byte(script.String()), f.restore, "--noflush"); err != nil {
			return err
		}
	}
	return removeNewEmptyTables(f, before, logf)
}

// removeNewEmptyTables deletes, with the nftables backend, the iptables
// tables the cluster's rules brought into existence once they are empty
// again (the legacy backend cannot remove a table; normalizeNetfilter
// ignores empty ones).
func removeNewEmptyTables(f family, before map[string]*savedTable, logf func(string, ...any)) error {
	version, err := run(nil, strings.Replace(f.save, "-save", "", 1), "-V")
	if err != nil || !strings.Contains(version, "nf_tables") {
		return nil
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return nil
	}
	text, err := run(nil, f.save)
	if err != nil {
		return err
	}
	var errs []error
	for name, t := range parseSave(text) {
		if before[name] != nil || len(t.rules) > 0 {
			continue
		}
		logf("nft: deleting table %s %s (created by the cluster, empty)", f.nft, name)
		if _, err := run(nil, "nft", "delete", "table", f.nft, name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// run runs a host tool and returns its stdout; the error carries stderr.
func run(stdin []byte, name string, args ...string) (string, error) {
	return harness.Command{Bin: name, Args: args, Stdin: stdin}.Run(context.Background())
}
