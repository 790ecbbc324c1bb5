package rls

import (
	"errors"
	"fmt"
	"math"
	"net/netip"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate/tollgate/guard"
)

// Descriptor entry keys with a meaning of their own.
const (
	entryAPIKey        = "api_key"
	entryGenericKey    = "generic_key"
	entryTenant        = "tenant"
	entryRemoteAddress = "remote_address"
	entryPath          = "path"
	entryEndpoint      = "endpoint"
	entryMethod        = "method"
)

// limits bound what one call may hold.
type limits struct {
	descriptors int // descriptors per call
	entries     int // entries per descriptor
	valueLen    int // bytes of a domain, entry key or entry value
}

// invalidError is a malformed call: gRPC InvalidArgument. Its message never
// quotes an entry's value.
type invalidError struct{ msg string }

func (e *invalidError) Error() string { return e.msg }

func invalidf(format string, args ...any) error {
	return &invalidError{msg: fmt.Sprintf(format, args...)}
}

// convert turns a call into one guard request per descriptor, in c's
// storage (c.reqs, c.peek; c.peek[i] reports that descriptor i is a peek:
// hits_addend present and 0). The requests' Descriptor maps are c's,
// reused from call to call; the strings are the call's.
func (l limits) convert(req *rlsv3.RateLimitRequest, c *call) error {
	if req == nil {
		return invalidf("empty request")
	}
	switch {
	case req.Domain == "":
		return invalidf("domain is empty")
	case len(req.Domain) > l.valueLen:
		return invalidf("domain is longer than %d bytes", l.valueLen)
	case len(req.Descriptors) == 0:
		return invalidf("no descriptors")
	case len(req.Descriptors) > l.descriptors:
		return invalidf("%d descriptors, at most %d allowed", len(req.Descriptors), l.descriptors)
	}
	c.size(len(req.Descriptors))
	for i, d := range req.Descriptors {
		var err error
		if c.peek[i], err = l.descriptor(req.Domain, d, req.HitsAddend, &c.reqs[i], c.maps[i]); err != nil {
			var inv *invalidError
			if errors.As(err, &inv) {
				inv.msg = fmt.Sprintf("descriptor %d: %s", i, inv.msg)
			}
			return err
		}
	}
	return nil
}

// descriptor fills r from one descriptor of a call in domain whose
// request-level hits_addend is hits, with m (emptied first) as its
// Descriptor, and reports whether it is a peek.
func (l limits) descriptor(domain string, d *ratelimitv3.RateLimitDescriptor, hits uint32, r *guard.Request, m map[string]string) (peek bool, err error) {
	switch {
	case d == nil || len(d.Entries) == 0:
		return false, invalidf("no entries")
	case len(d.Entries) > l.entries:
		return false, invalidf("%d entries, at most %d allowed", len(d.Entries), l.entries)
	case d.IsNegativeHits:
		return false, invalidf("is_negative_hits is not supported")
	}
	clear(m)
	*r = guard.Request{Domain: domain, Descriptor: m, Surface: "rls"}
	for j, e := range d.Entries {
		switch {
		case e == nil || e.Key == "":
			return false, invalidf("entry %d: empty key", j)
		case len(e.Key) > l.valueLen:
			return false, invalidf("entry %d: key longer than %d bytes", j, l.valueLen)
		case len(e.Value) > l.valueLen:
			return false, invalidf("entry %d (%.64q): value longer than %d bytes", j, e.Key, l.valueLen)
		}
		if v, ok := r.Descriptor[e.Key]; ok && v != e.Value {
			return false, invalidf("entry %d (%.64q): key given twice with different values", j, e.Key)
		}
		r.Descriptor[e.Key] = e.Value
	}
	if v, ok := m[entryAPIKey]; ok {
		r.Key = v
	} else {
		r.Key = m[entryGenericKey]
	}
	r.Tenant = m[entryTenant]
	if v, ok := m[entryPath]; ok {
		r.Path = v
	} else {
		r.Path = m[entryEndpoint]
	}
	r.Method = m[entryMethod]
	if v, ok := m[entryRemoteAddress]; ok {
		ip, err := netip.ParseAddr(v)
		if err != nil {
			return false, invalidf("remote_address is not an IP address")
		}
		r.IP = ip.Unmap().WithZone("")
	}

	switch {
	case d.HitsAddend != nil && d.HitsAddend.Value == 0:
		return true, nil
	case d.HitsAddend != nil:
		r.Cost = int64(min(d.HitsAddend.Value, math.MaxInt64))
	case hits > 0:
		r.Cost = int64(hits)
	default:
		r.Cost = 1
	}
	return false, nil
}
