package rls_test

import (
	"encoding/json"
	"os"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// TestEnvoyConfig checks configs/envoy/envoy.yaml against Envoy's own
// schema (the v3 bootstrap with its validation rules) and that it points
// the rate-limit filter at Tollgate as documented: domain tollgate, the
// gRPC service at 127.0.0.1:8089 (TOLLGATE_GRPC_LISTEN's default), and
// descriptors carrying api_key from X-API-Key, remote_address and path.
func TestEnvoyConfig(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("../../../configs/envoy/envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc any
	if err := yaml.Unmarshal(src, &doc); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	var b bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &b); err != nil {
		t.Fatalf("not an Envoy v3 bootstrap: %v", err)
	}
	if err := b.ValidateAll(); err != nil {
		t.Fatalf("invalid: %v", err)
	}

	var hcm hcmv3.HttpConnectionManager
	if err := b.StaticResources.Listeners[0].FilterChains[0].Filters[0].GetTypedConfig().UnmarshalTo(&hcm); err != nil {
		t.Fatal(err)
	}
	var rl *ratelimitv3.RateLimit
	for _, f := range hcm.HttpFilters {
		if f.Name == "envoy.filters.http.ratelimit" {
			rl = new(ratelimitv3.RateLimit)
			if err := f.GetTypedConfig().UnmarshalTo(rl); err != nil {
				t.Fatal(err)
			}
		}
	}
	if rl == nil || rl.Domain != "tollgate" {
		t.Fatalf("rate-limit filter %v, want domain tollgate", rl)
	}
	cluster := rl.RateLimitService.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	found := false
	for _, c := range b.StaticResources.Clusters {
		if c.Name != cluster {
			continue
		}
		sa := c.LoadAssignment.Endpoints[0].LbEndpoints[0].GetEndpoint().Address.GetSocketAddress()
		found = sa.Address == "127.0.0.1" && sa.GetPortValue() == 8089 && c.TypedExtensionProtocolOptions != nil
	}
	if !found {
		t.Errorf("no HTTP/2 cluster %q at 127.0.0.1:8089", cluster)
	}

	keys := map[string]string{}
	for _, a := range hcm.GetRouteConfig().VirtualHosts[0].RateLimits[0].Actions {
		switch s := a.ActionSpecifier.(type) {
		case *routev3.RateLimit_Action_RequestHeaders_:
			keys[s.RequestHeaders.DescriptorKey] = s.RequestHeaders.HeaderName
		case *routev3.RateLimit_Action_RemoteAddress_:
			keys["remote_address"] = ""
		}
	}
	for k, h := range map[string]string{"api_key": "x-api-key", "remote_address": "", "path": ":path"} {
		if got, ok := keys[k]; !ok || got != h {
			t.Errorf("descriptor entry %s: from %q (present %v), want %q", k, got, ok, h)
		}
	}
}
