package rules

import "time"

// ParseDuration reads a duration as the rules file writes them: positive
// integer components with units ms, s, m, h or d ("10m", "1h30m", "1d"),
// at most 366 days. The operator API uses it for ttl fields so one syntax
// serves every Tollgate duration an operator types.
func ParseDuration(s string) (time.Duration, error) {
	us, err := parseDuration(s)
	if err != nil {
		return 0, err
	}
	return time.Duration(us) * time.Microsecond, nil
}
