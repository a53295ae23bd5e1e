package results

import (
	"fmt"
	"strings"
)

// MakeTestFile holds how long `make test` took on a fresh machine:
// hack/time-make-test.sh writes its fresh copy under OutputDir, and the
// README's make-test section is rendered from the committed one.
const MakeTestFile = "integration/results/make-test.json"

// MakeTest is MakeTestFile.
type MakeTest struct {
	Date        string `json:"date"`
	Commit      string `json:"commit"`
	Seconds     int    `json:"seconds"`
	ExitStatus  int    `json:"exit_status"`
	TestsPassed int    `json:"tests_passed"`
	Cores       int    `json:"cores"`
	// MeanLoadAverage is the machine's 1-minute load average over the
	// run, sampled each minute: above Cores, other work shared the
	// machine and the time is an upper bound.
	MeanLoadAverage float64 `json:"mean_load_average"`
	Go              string  `json:"go"`
	// AptInstalled are the Debian packages of hack/apt-packages.txt the
	// run installed, comma-separated ("" when the machine had them all).
	AptInstalled string `json:"apt_installed_by_the_run"`
}

// RenderMakeTest renders the README's make-test section; a failed run, or
// one in which no test passed, is refused: the README quotes only a green
// run.
func RenderMakeTest(m MakeTest) (string, error) {
	if m.ExitStatus != 0 || m.TestsPassed == 0 || m.Seconds <= 0 {
		return "", fmt.Errorf("not a green run: exit status %d, %d tests passed, %d s", m.ExitStatus, m.TestsPassed, m.Seconds)
	}
	apt := "every Debian package it needs was already there"
	if m.AptInstalled != "" {
		apt = "it installed " + strings.ReplaceAll(m.AptInstalled, ",", ", ") + " itself"
	}
	busy := ""
	if m.MeanLoadAverage > float64(m.Cores) {
		busy = fmt.Sprintf(";\nthe machine was shared with other work (mean load average %.1f), so this\nis an upper bound", m.MeanLoadAverage)
	}
	return fmt.Sprintf("On a fresh clone with empty Go caches and no tools built, `make test`\n"+
		"took %d min %02d s on %d cores, with %d tests passed (%s, %s, commit\n%s; %s%s).\n",
		m.Seconds/60, m.Seconds%60, m.Cores, m.TestsPassed, m.Date, m.Go, m.Commit, apt, busy), nil
}

func readMakeTest(root string) (string, error) {
	var m MakeTest
	if err := Read(root+"/"+MakeTestFile, &m); err != nil {
		return "", err
	}
	text, err := RenderMakeTest(m)
	if err != nil {
		return "", fmt.Errorf("%s: %w", MakeTestFile, err)
	}
	return text, nil
}
