package bench

import (
	"fmt"
	"math"
)

// ms formats milliseconds for a table ("–" when not measured).
func ms(x float64) string {
	if math.IsNaN(x) {
		return "–"
	}
	return fmt.Sprintf("%.2f", x)
}

// signedMs formats a difference in milliseconds, its sign shown.
func signedMs(x float64) string {
	if math.IsNaN(x) {
		return "–"
	}
	return fmt.Sprintf("%+.2f", x)
}
