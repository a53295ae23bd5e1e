package kube

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
)

// freePorts returns n distinct TCP ports nothing listens on, on any address.
// The listeners stay open until all are picked so the ports differ; a
// component may still lose a race for one, which its start-up then reports.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", ":0")
		if err != nil {
			return nil, fmt.Errorf("find a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// nodeIP returns the IPv4 address of the interface holding the default
// route: the apiserver must advertise a non-loopback address (the Endpoints
// API refuses loopback), and the kubelet reports it as the node's
// InternalIP.
func nodeIP() (net.IP, error) {
	iface, err := defaultRouteInterface()
	if err != nil {
		return nil, err
	}
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, fmt.Errorf("default route interface %s: %w", iface, err)
	}
	addrs, err := ifi.Addrs()
	if err != nil {
		return nil, fmt.Errorf("addresses of %s: %w", iface, err)
	}
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok && ipn.IP.To4() != nil && ipn.IP.IsGlobalUnicast() {
			return ipn.IP.To4(), nil
		}
	}
	return nil, fmt.Errorf("interface %s (default route) has no global IPv4 address", iface)
}

// defaultRouteInterface reads the interface of the IPv4 default route from
// /proc/net/route.
func defaultRouteInterface() (string, error) {
	f, err := os.Open("/proc/net/route")
	if err != nil {
		return "", fmt.Errorf("read routes: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 8 && fields[1] == "00000000" && fields[7] == "00000000" {
			return fields[0], nil
		}
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("read routes: %w", err)
	}
	return "", errors.New("no IPv4 default route: the node needs a non-loopback address for the apiserver to advertise")
}
