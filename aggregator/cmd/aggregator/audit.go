package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/adminapi"
	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/aggregator/internal/state"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/guard/keyid"
)

const auditUsage = `Usage: aggregator audit --snapshot DIR [--key KEY] [--kind KIND] [--from TIME] [--to TIME]

Reads an audit snapshot offline (a directory under <data_dir>/snapshots, or
a stopped instance's <data_dir>/state) and prints, as JSON lines, the audit
entries it holds that match the filters, oldest first, then one line per
tenant with the usage totals it holds ({"usage": …}).

  --key KEY     only entries about this key: kid:<key_id>, or a raw API key
                (then TOLLGATE_KEY_SECRET must be set to derive its key_id)
  --subject S   only entries with this subject (a key_id, rules, …)
  --kind KIND   rules, rollback, blocklist, allowlist, override, penalty,
                reset, quota or regions
  --from TIME   RFC 3339; entries at or after it
  --to TIME     RFC 3339; entries before it
  --no-usage    do not print the usage totals
`

// runAudit is `aggregator audit`.
func runAudit(args []string, lookup configs.LookupFunc, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("aggregator audit", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dir := fs.String("snapshot", "", "")
	key := fs.String("key", "", "")
	subject := fs.String("subject", "", "")
	kind := fs.String("kind", "", "")
	from := fs.String("from", "", "")
	to := fs.String("to", "", "")
	noUsage := fs.Bool("no-usage", false, "")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			_, _ = io.WriteString(stdout, auditUsage)
			return 0
		}
		fmt.Fprintf(stderr, "aggregator audit: %v\n%s", err, auditUsage)
		return 2
	}
	if *dir == "" {
		fmt.Fprintf(stderr, "aggregator audit: --snapshot is required\n%s", auditUsage)
		return 2
	}
	q := audit.Query{Kind: *kind, Subject: *subject, Limit: 1 << 30}
	if *key != "" {
		if id, ok := strings.CutPrefix(*key, "kid:"); ok {
			q.Subject = id
		} else {
			secret, _ := lookup("TOLLGATE_KEY_SECRET")
			h, err := keyid.New([]byte(secret))
			if err != nil {
				fmt.Fprintln(stderr, "aggregator audit: a raw --key needs TOLLGATE_KEY_SECRET (or pass kid:<key_id>)")
				return 2
			}
			q.Subject = h.ID(*key)
		}
	}
	for _, f := range []struct {
		s   string
		dst *time.Time
	}{{*from, &q.From}, {*to, &q.To}} {
		if f.s == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, f.s)
		if err != nil {
			fmt.Fprintf(stderr, "aggregator audit: %q is not an RFC 3339 time\n", f.s)
			return 2
		}
		*f.dst = t
	}
	db, err := state.OpenReadOnly(*dir, nil)
	if err != nil {
		fmt.Fprintf(stderr, "aggregator audit: %v\n", err)
		return 1
	}
	defer db.Close()
	entries, err := audit.NewStore(db, nil).Query(q)
	if err != nil {
		fmt.Fprintf(stderr, "aggregator audit: %v\n", err)
		return 1
	}
	enc := json.NewEncoder(stdout)
	for _, e := range entries {
		_ = enc.Encode(adminapi.EntryJSON(e))
	}
	if *noUsage {
		return 0
	}
	totals, err := db.TenantTotals()
	if err != nil {
		fmt.Fprintf(stderr, "aggregator audit: %v\n", err)
		return 1
	}
	for _, t := range totals {
		_ = enc.Encode(map[string]any{"usage": map[string]any{"tenant": t.Tenant, "allowed": t.Allowed, "rejected": t.Rejected,
			"cost": t.Cost, "from": time.Unix(t.From, 0).UTC().Format(time.RFC3339), "to": time.Unix(t.To, 0).UTC().Format(time.RFC3339)}})
	}
	return 0
}
