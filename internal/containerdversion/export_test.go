package containerdversion

import "context"

// Ask asks the containerd at address for its release once, waiting for it
// to answer for a short while.
func Ask(ctx context.Context, address string) (major, minor int, err error) {
	version, err := AskVersion(ctx, address)
	if err != nil {
		return 0, 0, err
	}
	return Parse(version)
}
