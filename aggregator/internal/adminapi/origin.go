package adminapi

import "context"

type originKey struct{}

// WithOrigin marks a change's request as a global change made in region:
// its audit entries name that region (origin_region).
func WithOrigin(ctx context.Context, region string) context.Context {
	return context.WithValue(ctx, originKey{}, region)
}

// originOf is the region WithOrigin put in ctx, or "".
func originOf(ctx context.Context) string {
	s, _ := ctx.Value(originKey{}).(string)
	return s
}
