// Package helm checks Tollgate's Helm chart (compose/helm/tollgate) with the
// real helm, as a library: every documented value set (tollgate/ci) is
// linted (helm lint --strict) and rendered, and every rendered object is
// decoded strictly with the Kubernetes API's own Go types (k8s.io/api, and
// the Prometheus Operator's for ServiceMonitors): an unknown field, a
// misspelt kind or a wrong type fails. Then what must hold for Tollgate:
// variables that exist and load, listeners on the binaries' ports,
// probes on the health endpoints (and answered by the real gateway and
// aggregator started with the chart's environment), one identity per pod,
// a drain that fits the termination grace period, private operator and
// rate-limit APIs, secrets only from Secrets, valid rules.
//
// It is a module of its own so that helm and the Kubernetes libraries stay
// out of the module the guard's users import; `make test` runs it.
package helm
