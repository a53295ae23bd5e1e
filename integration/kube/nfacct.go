package kube

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// kube-proxy counts dropped packets in netfilter accounting objects
// (nfacct, e.g. ct_state_invalid_dropped_pkts), which outlive the rules
// using them; nft and iptables-save do not list them. This is the small
// part of the nfnetlink_acct protocol that lists and deletes them.

// nfacct message types (linux/netfilter/nfnetlink_acct.h).
const (
	nfacctGet  = 1
	nfacctDel  = 3
	nfacctName = 1 // NFACCT_NAME attribute
)

// nfacctNames returns the names of every nfacct object, sorted.
func nfacctNames() ([]string, error) {
	msgs, err := nfacctRequest(nfacctGet, unix.NLM_F_DUMP, "")
	if err != nil {
		return nil, fmt.Errorf("list nfacct objects: %w", err)
	}
	var names []string
	for _, m := range msgs {
		if len(m.Data) < 4 {
			continue
		}
		// The nfgenmsg header (4 bytes) precedes the attributes.
		attrs := m.Data[4:]
		for len(attrs) >= 4 {
			l := int(binary.NativeEndian.Uint16(attrs[0:2]))
			typ := binary.NativeEndian.Uint16(attrs[2:4]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER)
			if l < 4 || l > len(attrs) {
				break
			}
			if typ == nfacctName {
				names = append(names, strings.TrimRight(string(attrs[4:l]), "\x00"))
			}
			attrs = attrs[min((l+3)&^3, len(attrs)):]
		}
	}
	sort.Strings(names)
	return names, nil
}

// deleteNfacct deletes the nfacct object name (no rule may use it).
func deleteNfacct(name string) error {
	if _, err := nfacctRequest(nfacctDel, unix.NLM_F_ACK, name); err != nil {
		return fmt.Errorf("delete nfacct object %s: %w", name, err)
	}
	return nil
}

// nfacctRequest sends one nfnetlink_acct request (with a NFACCT_NAME
// attribute unless name is empty) and returns the answers up to the end of
// a dump or the acknowledgement.
func nfacctRequest(cmd int, flags uint16, name string) ([]syscall.NetlinkMessage, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("bind netlink socket: %w", err)
	}
	body := []byte{unix.AF_UNSPEC, unix.NFNETLINK_V0, 0, 0}
	if name != "" {
		val := append([]byte(name), 0)
		attr := make([]byte, 4, 4+len(val)+3)
		binary.NativeEndian.PutUint16(attr[0:2], uint16(4+len(val)))
		binary.NativeEndian.PutUint16(attr[2:4], nfacctName)
		attr = append(attr, val...)
		for len(attr)%4 != 0 {
			attr = append(attr, 0)
		}
		body = append(body, attr...)
	}
	hdr := make([]byte, unix.SizeofNlMsghdr)
	binary.NativeEndian.PutUint32(hdr[0:4], uint32(len(hdr)+len(body)))
	binary.NativeEndian.PutUint16(hdr[4:6], uint16(unix.NFNL_SUBSYS_ACCT<<8|cmd))
	binary.NativeEndian.PutUint16(hdr[6:8], unix.NLM_F_REQUEST|flags)
	binary.NativeEndian.PutUint32(hdr[8:12], 1) // sequence number
	if err := unix.Sendto(fd, append(hdr, body...), 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink send: %w", err)
	}
	var out []syscall.NetlinkMessage
	buf := make([]byte, 1<<16)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("netlink receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("parse netlink answer: %w", err)
		}
		for _, m := range msgs {
			switch m.Header.Type {
			case unix.NLMSG_DONE:
				return out, nil
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return nil, errors.New("short netlink error message")
				}
				if code := int32(binary.NativeEndian.Uint32(m.Data[0:4])); code != 0 {
					return nil, syscall.Errno(-code)
				}
				return out, nil // the acknowledgement
			default:
				out = append(out, m)
			}
		}
		if flags&unix.NLM_F_DUMP == 0 && flags&unix.NLM_F_ACK == 0 {
			return out, nil
		}
	}
}

// restoreNfacct deletes the nfacct objects that did not exist before
// (recorded as one name a line), once the rules using them are gone.
func restoreNfacct(before string, logf func(string, ...any)) error {
	names, err := nfacctNames()
	if err != nil {
		return err
	}
	had := map[string]bool{}
	for _, n := range strings.Split(before, "\n") {
		had[n] = true
	}
	var errs []error
	for _, n := range names {
		if !had[n] {
			logf("deleting nfacct object %s (created by kube-proxy)", n)
			errs = append(errs, deleteNfacct(n))
		}
	}
	return errors.Join(errs...)
}
